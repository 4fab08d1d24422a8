"""Tokenizer of a Hugging Face model directory -> GGUF tokenizer.* metadata: byte-level BPE from
tokenizer.json (vocab, merges, pre-tokenizer name), SentencePiece from tokenizer.model or from a
SentencePiece-style tokenizer.json (Metaspace + byte-fallback BPE), BERT's WordPiece from tokenizer.json
(llama.cpp's "bert" form), SentencePiece Unigram from tokenizer.json (XLM-RoBERTa's, llama.cpp's "t5" form);
Gemma 4's byte-fallback BPE from tokenizer.json as llama.cpp's converter writes it (tokenizer model "gemma4");
special tokens, add_bos/eos/sep, and the chat template."""
import base64
import json
import os
import re
from dataclasses import dataclass, field

from .convert_error import ConvertError

# GGUF token types (the numbering of SentencePiece's ModelProto.SentencePiece.Type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Split regexes of the byte-level BPE pre-tokenizers ember knows, as tokenizer.json stores them.
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
              r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
              r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_RE = _TEKKEN_RE.replace(r"\p{M}]+|", r"\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|").replace(
    r"\p{M}]*|\p{N}|", r"\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|")
PRE_NAMES = ("gpt-2", "llama-bpe", "qwen2", "smollm", "tekken", "gpt-4o")
_BYTE_TOKEN_RE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


@dataclass
class Vocab:
    model: str                       # tokenizer.ggml.model: "gpt2", "llama", "bert", "t5" or "gemma4"
    tokens: list
    types: list
    scores: list = None
    merges: list = None
    pre: str = None
    add_space_prefix: bool = None
    remove_extra_whitespaces: bool = None
    special_ids: dict = field(default_factory=dict)   # "bos"/"eos"/"unk"/"pad"/"sep" -> id
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = None
    lowercase: bool = None           # WordPiece: BertNormalizer's lowercase and strip_accents
    strip_accents: bool = None
    charsmap: bytes = None           # Unigram: the Precompiled normalizer's charsmap
    chat_template: object = None


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise ConvertError(f"{path}: malformed JSON ({e})") from None


def _components(node):
    """A pre-tokenizer/normalizer as a flat list of its parts (Sequence nodes expanded)."""
    if not node:
        return []
    if node.get("type") == "Sequence":
        parts = node.get("pretokenizers") or node.get("normalizers") or []
        return [c for p in parts for c in _components(p)]
    return [node]


def identify_pre(tokenizer_json):
    """The llama.cpp pre-tokenizer name whose split rules equal this tokenizer.json's."""
    parts = _components(tokenizer_json.get("pre_tokenizer"))
    kinds = [p.get("type") for p in parts]
    if any(p.get("type") == "ByteLevel" and p.get("add_prefix_space") for p in parts):
        raise ConvertError("tokenizer.json: ByteLevel pre-tokenizer with add_prefix_space is not supported")
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        split = parts[0]
        regex = (split.get("pattern") or {}).get("Regex")
        if split.get("behavior") == "Isolated" and not split.get("invert"):
            if regex == _LLAMA3_RE:
                return "llama-bpe"
            if regex == _QWEN2_RE:
                return "qwen2"
            if regex == _TEKKEN_RE:
                return "tekken"
            if regex == _GPT4O_RE:
                return "gpt-4o"
    summary = json.dumps(tokenizer_json.get("pre_tokenizer"))[:200]
    raise ConvertError(f"tokenizer.json: unrecognised pre-tokenizer {summary} "
                       f"(pass --pre with one of {', '.join(PRE_NAMES)} if it splits text the same way)")


def _pad(tokens, types, scores, n_vocab):
    """Extends the token list to the model's vocab_size (embedding rows with no token)."""
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
        if scores is not None:
            scores.append(-1000.0)


def _place_added(tokens, types, added, path):
    """Puts tokenizer.json's added_tokens at their ids (inside or past the base vocab)."""
    for a in added:
        i, text = int(a["id"]), a["content"]
        while len(tokens) <= i:
            tokens.append(None)
            types.append(UNUSED)
        if tokens[i] is not None and tokens[i] != text:
            raise ConvertError(f"{path}: added token {text!r} has id {i}, already used by {tokens[i]!r}")
        tokens[i] = text
        types[i] = CONTROL if a.get("special") else USER_DEFINED


def _from_vocab_dict(model, path):
    vocab = model.get("vocab") or {}
    if not isinstance(vocab, dict):
        raise ConvertError(f"{path}: model.vocab is not a token -> id map")
    tokens = [None] * (max(vocab.values()) + 1 if vocab else 0)
    for text, i in vocab.items():
        tokens[i] = text
    return tokens, [NORMAL] * len(tokens)


def _merges(model):
    # Older files store "a b" strings, newer ones [a, b] pairs; GGUF stores "a b".
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]


def _fill_holes(tokens, types):
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i] = f"[PAD{i}]"
            types[i] = UNUSED


def _bpe_from_json(tj, path, pre_override):
    model = tj["model"]
    tokens, types = _from_vocab_dict(model, path)
    _place_added(tokens, types, tj.get("added_tokens") or [], path)
    _fill_holes(tokens, types)
    return Vocab(model="gpt2", tokens=tokens, types=types, merges=_merges(model),
                 pre=pre_override or identify_pre(tj))


def _spm_from_json(tj, path):
    """A SentencePiece model exported as tokenizer.json: byte-fallback BPE over "▁"-joined text.
    llama.cpp's SentencePiece tokenizer merges the best-scored pair first; giving each token the
    negated rank of the first merge producing it reproduces the BPE merge order."""
    model = tj["model"]
    tokens, types = _from_vocab_dict(model, path)
    merges = _merges(model)
    scores = [0.0] * len(tokens)
    ranked = {}
    for rank, m in enumerate(merges):
        a, b = m.split(" ", 1)
        ranked.setdefault(a + b, rank)
    index = {t: i for i, t in enumerate(tokens) if t is not None}
    for text, i in index.items():
        if text in ranked:
            scores[i] = -float(ranked[text])
        elif len(text) > 1:
            scores[i] = -float(len(merges) + i)   # reachable only through a merge: lowest priority
        if _BYTE_TOKEN_RE.match(text):
            types[i] = BYTE
    unk = model.get("unk_token")
    if unk in index:
        types[index[unk]] = UNKNOWN
    _place_added(tokens, types, tj.get("added_tokens") or [], path)
    _fill_holes(tokens, types)
    scores += [0.0] * (len(tokens) - len(scores))
    norm = _components(tj.get("normalizer"))
    pre = _components(tj.get("pre_tokenizer"))
    prefix = any(n.get("type") == "Prepend" for n in norm) or any(
        p.get("type") == "Metaspace" and p.get("prepend_scheme", "always") != "never"
        and p.get("add_prefix_space", True) for p in pre)
    return Vocab(model="llama", tokens=tokens, types=types, scores=scores,
                 add_space_prefix=prefix, remove_extra_whitespaces=False)


# Tokens llama.cpp's converter types USER_DEFINED in a Gemma 4 vocab, so that their text is always shown
# (the chat parser reads them).
_GEMMA4_VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                   "<tool_response|>", "<|\"|>"}
# GemmaTokenizer's special tokens where tokenizer_config.json names none.
_GEMMA_SPECIALS = {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>", "mask": "<mask>"}


def is_gemma4_json(tj):
    """Whether tokenizer.json is the byte-fallback BPE llama.cpp converts as Gemma 4's (its LlamaHfVocab)."""
    model, decoder = (tj or {}).get("model") or {}, (tj or {}).get("decoder") or {}
    return model.get("type") == "BPE" and bool(model.get("byte_fallback")) and decoder.get("type") == "Sequence"


def _gemma4_merge(m):
    # As llama.cpp's converter: [a, b] pairs joined by a space, a space inside a side written as U+0120.
    if isinstance(m, str):
        return m
    return " ".join("".join(chr(ord(c) + 256) if c == " " else c for c in side) for side in m)


def _gemma4_from_json(tj, tcfg, path):
    """Gemma 4's tokenizer as llama.cpp's converter writes it: the BPE vocab with the added tokens past it,
    scores of -1000, <0xNN> tokens BYTE, special tokens CONTROL (those tokenizer_config.json names, and the
    added tokens marked special, which HF's tokenizer splits off the text), the chat parser's markers
    USER_DEFINED, the merges, add_bos, no space prefix. tokenizer.ggml.pre is not written: llama.cpp's
    "gemma4" model implies its pre-tokenizer (spaces as U+2581, merges over whole lines)."""
    model = tj["model"]
    tokens, types = _from_vocab_dict(model, path)
    base = len(tokens)
    added = tj.get("added_tokens") or []
    named = {}
    for kind, text in _GEMMA_SPECIALS.items():
        named[kind] = _token_text(tcfg.get(f"{kind}_token")) if f"{kind}_token" in tcfg else text
    for kind in ("sep", "cls"):
        named[kind] = _token_text(tcfg.get(f"{kind}_token"))
    extra = tcfg.get("extra_special_tokens") or tcfg.get("additional_special_tokens") or []
    if isinstance(extra, dict):
        extra = list(extra.values())
    special = {t for t in named.values() if t} | {_token_text(t) for t in extra} | {
        a["content"] for a in added if a.get("special")}
    for a in added:
        i, text = int(a["id"]), a["content"]
        if i < base:
            if tokens[i] != text:
                raise ConvertError(f"{path}: added token {text!r} has id {i}, already used by {tokens[i]!r}")
            continue
        _place_added(tokens, types, [a], path)
    _fill_holes(tokens, types)
    for i, t in enumerate(tokens):
        if types[i] == UNUSED:
            continue
        if t in _GEMMA4_VISIBLE:
            types[i] = USER_DEFINED
        elif _BYTE_TOKEN_RE.match(t):
            types[i] = BYTE
        elif t in special:
            types[i] = CONTROL
        elif i < base:
            types[i] = NORMAL
    v = Vocab(model="gemma4", tokens=tokens, types=types, scores=[-1000.0] * len(tokens),
              merges=[_gemma4_merge(m) for m in model.get("merges") or []], add_space_prefix=False, add_bos=True)
    index = {}
    for i, t in enumerate(tokens):
        index.setdefault(t, i)
    for kind, text in named.items():
        if kind != "cls" and text in index:
            v.special_ids[kind] = index[text]
    return v


def _bert_normalizer(node):
    """(lowercase, strip_accents) of tokenizer.json's normalizer: BertNormalizer's, or the Lowercase and
    StripAccents steps of a Sequence; strip_accents unset follows lowercase, as BertNormalizer's does."""
    lowercase, strip = False, None
    for n in _components(node):
        kind = n.get("type")
        if kind == "BertNormalizer":
            lowercase = bool(n.get("lowercase", True))
            if n.get("strip_accents") is not None:
                strip = bool(n["strip_accents"])
        elif kind == "Lowercase":
            lowercase = True
        elif kind == "StripAccents":
            strip = True
    return lowercase, lowercase if strip is None else strip


def _wordpiece_from_json(tj, path):
    """BERT's WordPiece as llama.cpp stores it: a word-start piece as "\u2581piece", a continuation without
    its "##", special tokens as they are; [CLS] is the BOS and [SEP] the separator."""
    model = tj["model"]
    tokens, types = _from_vocab_dict(model, path)
    _place_added(tokens, types, [a for a in tj.get("added_tokens") or [] if a.get("special")], path)
    _fill_holes(tokens, types)
    prefix = model.get("continuing_subword_prefix") or "##"
    for i, t in enumerate(tokens):
        if types[i] == NORMAL:
            tokens[i] = t[len(prefix):] if t.startswith(prefix) else "\u2581" + t
    lowercase, strip = _bert_normalizer(tj.get("normalizer"))
    v = Vocab(model="bert", tokens=tokens, types=types, lowercase=lowercase, strip_accents=strip)
    index = {t: i for i, t in enumerate(tokens) if types[i] == CONTROL}
    for kind, text in (("unk", model.get("unk_token")), ("bos", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]")):
        if text in index:
            v.special_ids[kind] = index[text]
    return v


def _unigram_from_json(tj, path):
    """A Unigram tokenizer.json (XLM-RoBERTa's) as llama.cpp stores it: the pieces with their scores, the
    Precompiled normalizer's charsmap, a U+2581 before each word (Metaspace after a whitespace split); <s>
    is the BOS, </s> the EOS and the separator of a pair (<s> A </s></s> B </s>)."""
    model = tj["model"]
    pieces = model.get("vocab")
    if not isinstance(pieces, list) or not all(isinstance(p, list) and len(p) == 2 for p in pieces):
        raise ConvertError(f"{path}: a Unigram model.vocab is a list of [piece, score] pairs")
    if model.get("byte_fallback"):
        raise ConvertError(f"{path}: Unigram with byte_fallback is not supported")
    tokens, scores, types = [p[0] for p in pieces], [float(p[1]) for p in pieces], [NORMAL] * len(pieces)
    unk = model.get("unk_id")
    if not isinstance(unk, int) or not 0 <= unk < len(tokens):
        raise ConvertError(f"{path}: a Unigram model needs its unk_id, got {unk!r}")
    for a in tj.get("added_tokens") or []:
        i = int(a["id"])
        if i < len(tokens) and tokens[i] == a["content"]:
            types[i] = CONTROL if a.get("special") else USER_DEFINED
        else:
            _place_added(tokens, types, [a], path)
            scores += [0.0] * (len(tokens) - len(scores))
    _fill_holes(tokens, types)
    types[unk] = UNKNOWN
    charsmap = next((n.get("precompiled_charsmap") for n in _components(tj.get("normalizer"))
                     if n.get("type") == "Precompiled"), None)
    pre = _components(tj.get("pre_tokenizer"))
    meta = next((n for n in pre if n.get("type") == "Metaspace"), None)
    prefix = meta is not None and meta.get("prepend_scheme", "always") != "never" and meta.get("add_prefix_space", True)
    v = Vocab(model="t5", tokens=tokens, types=types, scores=scores, add_space_prefix=prefix,
              remove_extra_whitespaces=any(n.get("type") == "WhitespaceSplit" for n in pre),
              charsmap=base64.b64decode(charsmap) if charsmap else None, add_sep=True)
    index = {t: i for i, t in enumerate(tokens) if types[i] == CONTROL}
    v.special_ids["unk"] = unk
    for kind, text in (("bos", "<s>"), ("eos", "</s>"), ("sep", "</s>"), ("pad", "<pad>")):
        if text in index:
            v.special_ids[kind] = index[text]
    if "sep" not in v.special_ids:
        v.add_sep = None
    return v


def _spm_from_model(path):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        try:
            proto.ParseFromString(f.read())
        except Exception as e:   # protobuf raises its own DecodeError
            raise ConvertError(f"{path}: not a SentencePiece model ({e})") from None
    if proto.trainer_spec.model_type not in (1, 2):   # UNIGRAM, BPE
        raise ConvertError(f"{path}: unsupported SentencePiece model type {proto.trainer_spec.model_type}")
    tokens = [p.piece for p in proto.pieces]
    types = [int(p.type) for p in proto.pieces]
    scores = [float(p.score) for p in proto.pieces]
    ids = {"unk": proto.trainer_spec.unk_id, "bos": proto.trainer_spec.bos_id,
           "eos": proto.trainer_spec.eos_id, "pad": proto.trainer_spec.pad_id}
    v = Vocab(model="llama", tokens=tokens, types=types, scores=scores,
              add_space_prefix=proto.normalizer_spec.add_dummy_prefix,
              remove_extra_whitespaces=proto.normalizer_spec.remove_extra_whitespaces,
              add_bos=True)
    v.special_ids = {k: i for k, i in ids.items() if 0 <= i < len(tokens)}
    return v


def _token_text(value):
    # tokenizer_config.json stores special tokens as strings or AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _post_processor_flags(tj):
    """add_bos/add_eos as the fast tokenizer's TemplateProcessing applies them; None if unknown."""
    post = (tj or {}).get("post_processor") or {}
    procs = (post.get("processors") or []) if post.get("type") == "Sequence" else [post]
    for p in procs:
        if p.get("type") == "TemplateProcessing":
            single = p.get("single") or []
            first = bool(single) and "SpecialToken" in single[0]
            last = len(single) > 1 and "SpecialToken" in single[-1]
            return first, last
    return None


def _chat_template(model_dir, config):
    tmpl = config.get("chat_template")
    if tmpl:
        return tmpl
    jinja = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    js = os.path.join(model_dir, "chat_template.json")
    if os.path.exists(js):
        return _read_json(js).get("chat_template")
    return None


def load_vocab(model_dir, model_config, pre_override=None):
    """Reads the tokenizer of model_dir; n_vocab rows of the embedding get a token each."""
    n_vocab = int(model_config["vocab_size"])
    tj_path = os.path.join(model_dir, "tokenizer.json")
    sp_path = os.path.join(model_dir, "tokenizer.model")
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    tj = _read_json(tj_path) if os.path.exists(tj_path) else None
    tcfg = _read_json(tc_path) if os.path.exists(tc_path) else {}

    gemma4 = {model_config.get("model_type"), (model_config.get("text_config") or {}).get("model_type")} & {
        "gemma4", "gemma4_text"}
    if gemma4 and tj is not None and not is_gemma4_json(tj):
        raise ConvertError(f"{tj_path}: a Gemma 4 tokenizer.json is a byte-fallback BPE with a Sequence decoder "
                           f"(as llama.cpp's converter reads it), got model {(tj.get('model') or {}).get('type')!r}")
    if gemma4 and tj is not None:
        vocab = _gemma4_from_json(tj, tcfg, tj_path)
    elif os.path.exists(sp_path):
        vocab = _spm_from_model(sp_path)
        # Tokens the HF tokenizer adds past the SentencePiece vocab, or marks special inside it.
        added = list(tj.get("added_tokens") or []) if tj else []
        for i, a in (tcfg.get("added_tokens_decoder") or {}).items():
            added.append({"id": int(i), "content": a.get("content"), "special": a.get("special")})
        for a in added:
            i = int(a["id"])
            if i < len(vocab.tokens) and vocab.tokens[i] == a["content"]:
                if a.get("special") and vocab.types[i] == NORMAL:
                    vocab.types[i] = CONTROL
            else:
                _place_added(vocab.tokens, vocab.types, [a], tj_path)
                vocab.scores += [0.0] * (len(vocab.tokens) - len(vocab.scores))
        _fill_holes(vocab.tokens, vocab.types)
    elif tj is not None:
        model = tj.get("model") or {}
        if model.get("type") not in ("BPE", "WordPiece", "Unigram"):
            raise ConvertError(f"{tj_path}: unsupported tokenizer model type {model.get('type')!r} "
                               f"(expected BPE, WordPiece or Unigram)")
        if model["type"] == "WordPiece":
            vocab = _wordpiece_from_json(tj, tj_path)
        elif model["type"] == "Unigram":
            vocab = _unigram_from_json(tj, tj_path)
        elif model.get("byte_fallback"):
            vocab = _spm_from_json(tj, tj_path)
        else:
            vocab = _bpe_from_json(tj, tj_path, pre_override)
    else:
        raise ConvertError(f"no tokenizer in {model_dir} (expected tokenizer.json or tokenizer.model)")

    if len(vocab.tokens) > n_vocab:
        raise ConvertError(f"tokenizer has {len(vocab.tokens)} tokens, more than vocab_size={n_vocab}")
    _pad(vocab.tokens, vocab.types, vocab.scores, n_vocab)

    index = {}
    for i, t in enumerate(vocab.tokens):
        index.setdefault(t, i)
    for kind in ("bos", "eos", "unk", "pad"):
        if vocab.model == "gemma4" and kind in vocab.special_ids:
            continue
        text = _token_text(tcfg.get(f"{kind}_token"))
        if text is not None and text in index:
            vocab.special_ids[kind] = index[text]
        elif kind not in vocab.special_ids:
            cid = model_config.get(f"{kind}_token_id")
            if isinstance(cid, list):
                cid = cid[0] if cid else None
            if isinstance(cid, int) and 0 <= cid < n_vocab:
                vocab.special_ids[kind] = cid

    flags = _post_processor_flags(tj)
    if vocab.model == "gemma4":   # llama.cpp's converter, and its loader, add BOS for Gemma 4 whatever the files say
        flags = (True, flags[1]) if flags else None
    if flags is not None:
        vocab.add_bos, vocab.add_eos = flags
    elif vocab.model == "gpt2":
        vocab.add_bos = vocab.add_eos = False
    if isinstance(tcfg.get("add_bos_token"), bool) and vocab.model != "gemma4":
        vocab.add_bos = tcfg["add_bos_token"]
    if isinstance(tcfg.get("add_eos_token"), bool):
        vocab.add_eos = tcfg["add_eos_token"]
    if vocab.model == "bert":   # what its template puts last is [SEP], never an EOS
        vocab.add_sep, vocab.add_eos = vocab.add_eos, False
    vocab.chat_template = _chat_template(model_dir, tcfg)
    return vocab


def add_vocab(writer, vocab):
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    elif vocab.model == "llama":
        writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges is not None:
        writer.add_token_merges(vocab.merges)
    setters = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id, "unk": writer.add_unk_token_id,
               "pad": writer.add_pad_token_id, "sep": writer.add_sep_token_id, "mask": writer.add_mask_token_id}
    for kind, i in vocab.special_ids.items():
        setters[kind](i)
    writer.add_add_bos_token(bool(vocab.add_bos))
    writer.add_add_eos_token(bool(vocab.add_eos))
    if vocab.add_sep is not None:
        writer.add_add_sep_token(bool(vocab.add_sep))
    if vocab.charsmap:
        writer.add_precompiled_charsmap(vocab.charsmap)
    if vocab.lowercase is not None:
        writer.add_bool("tokenizer.ggml.normalizer.lowercase", bool(vocab.lowercase))
        writer.add_bool("tokenizer.ggml.normalizer.strip_accents", bool(vocab.strip_accents))
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(bool(vocab.add_space_prefix))
    if vocab.remove_extra_whitespaces is not None:
        writer.add_remove_extra_whitespaces(bool(vocab.remove_extra_whitespaces))
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
