// Error types shared by the whole library. Library code never aborts on bad input: it throws
// one of these with a message naming the file / key / tensor / parameter and what was expected.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace ember {

// Bad input from the caller or a malformed file (Python: ValueError).
struct InvalidInput : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// A device or host allocation that cannot be satisfied (Python: MemoryError).
struct OutOfMemory : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Concatenate anything streamable into one message.
template <class... Args>
std::string cat(const Args&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
}

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
    throw InvalidInput(cat(args...));
}

}  // namespace ember
