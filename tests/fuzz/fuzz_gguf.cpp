// libFuzzer target: the GGUF reader on arbitrary bytes, then the tokenizer loader on whatever
// the reader accepts. Either may throw InvalidInput (a malformed file); any other exception, a
// crash or a sanitizer report is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ember/gguf.h"
#include "ember/status.h"
#include "ember/tokenizer.h"

namespace {

// GGUFFile reads a path: one in-memory file, rewritten for each input, opened through /proc.
int memory_file() {
    static const int fd = [] {
        int f = memfd_create("fuzz.gguf", 0);
        if (f < 0) {
            std::perror("memfd_create");
            std::abort();
        }
        return f;
    }();
    return fd;
}

void write_all(int fd, const uint8_t* data, size_t size) {
    if (ftruncate(fd, 0) != 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) std::abort();
    for (size_t done = 0; done < size;) {
        ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
        if (n <= 0) std::abort();
        done += static_cast<size_t>(n);
    }
}

// Reads every value the way the loaders do, so getters and type checks run on hostile values.
void touch(const ember::GGUFFile& f) {
    for (const auto& [key, value] : f.metadata()) {
        try {
            f.get_uint(key);
        } catch (const ember::InvalidInput&) {}
        try {
            f.get_int(key);
        } catch (const ember::InvalidInput&) {}
        try {
            f.get_float(key);
        } catch (const ember::InvalidInput&) {}
        try {
            f.get_bool(key);
        } catch (const ember::InvalidInput&) {}
        try {
            f.get_string(key);
        } catch (const ember::InvalidInput&) {}
        try {
            f.get_array(key);
        } catch (const ember::InvalidInput&) {}
    }
    volatile uint8_t sink = 0;
    for (const ember::GGUFTensor& t : f.tensors()) {
        if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
        (void)t.n_rows();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const int fd = memory_file();
    write_all(fd, data, size);
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    try {
        ember::GGUFFile f(path);
        touch(f);
        auto tok = ember::Tokenizer::from_gguf(f);
        const int32_t n = tok->n_vocab();
        for (int32_t id : tok->encode("Hello <|im_start|> world\n\xff 12345", true, true))
            if (id < 0 || id >= n) std::abort();
        tok->decode({0, n - 1}, true);
    } catch (const ember::InvalidInput&) {}
    return 0;
}
