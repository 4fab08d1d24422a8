"""Finding a GGUF of a Hugging Face repository in the local Hugging Face cache, for
`Llama.from_pretrained`: ember downloads nothing, so a file not there is a clear error that says
how to fetch it."""
from __future__ import annotations

import fnmatch
import os
import pathlib
from typing import Optional


def _hub_cache(cache_dir: Optional[str]) -> pathlib.Path:
    if cache_dir:
        return pathlib.Path(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return pathlib.Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return pathlib.Path(home).expanduser() / "hub"


def _snapshot(repo_dir: pathlib.Path, revision: str) -> Optional[pathlib.Path]:
    """The snapshot folder of revision (a branch or tag named in refs/, or a commit hash)."""
    ref = repo_dir / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    folder = repo_dir / "snapshots" / commit
    return folder if folder.is_dir() else None


def resolve(repo_id: str, filename: str, cache_dir: Optional[str] = None, revision: str = "main") -> str:
    """The path of filename (a name or an fnmatch pattern, as llama-cpp-python takes it) in repo_id's
    cached snapshot; FileNotFoundError saying what is missing and how to download it."""
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise ValueError(f"from_pretrained: repo_id must be 'owner/name', got {repo_id!r}")
    cache = _hub_cache(cache_dir)
    fetch = f"`hf download {repo_id} --include '{filename}'` (or huggingface_hub's hf_hub_download)"
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = _snapshot(repo_dir, revision) if repo_dir.is_dir() else None
    if snapshot is None:
        raise FileNotFoundError(f"from_pretrained: {repo_id} (revision {revision}) is not in the local Hugging Face "
                                f"cache ({cache}); ember does not download models: fetch it first with {fetch}")
    files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file() or p.is_symlink())
    matches = [f for f in files if fnmatch.fnmatch(f, filename) or fnmatch.fnmatch(os.path.basename(f), filename)]
    if not matches:
        raise FileNotFoundError(f"from_pretrained: no file matching {filename!r} in the cached {repo_id} ({snapshot}: "
                                f"{', '.join(files) or 'empty'}); fetch it with {fetch}")
    if len(matches) > 1:
        raise ValueError(f"from_pretrained: {filename!r} matches several files of {repo_id}: {', '.join(matches)}; "
                         f"name one")
    path = snapshot / matches[0]
    if not path.exists():   # a symlink into blobs/ whose download never finished
        raise FileNotFoundError(f"from_pretrained: {path} is a broken link in the Hugging Face cache (an "
                                f"interrupted download?); fetch it again with {fetch}")
    return str(path)
