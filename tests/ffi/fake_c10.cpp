/* A stand-in for PyTorch's c10::detail::torchCheckFail (c10/util/Exception.h: the
 * same signature, so the same mangled name, _ZN3c106detail14torchCheckFailEPKcS2_jS2_),
 * for torch_oom.cpp (issue 34). Built twice by run.sh: into the test program
 * (exported with -rdynamic, as a C++ program linked with libc10 would have it) and
 * as a shared library whose SONAME is libc10.so, which the program dlopens
 * RTLD_LOCAL, as Python imports PyTorch's libraries. It throws, as PyTorch's does
 * (c10::Error derives from std::exception); the message names where it came from. */
#include <cstdint>
#include <stdexcept>
#include <string>

namespace c10 {
namespace detail {
[[noreturn]] void torchCheckFail(const char *func, const char *file, uint32_t line,
                                 const char *msg);

[[noreturn]] void torchCheckFail(const char *func, const char *file, uint32_t line,
                                 const char *msg) {
    (void)file;
    (void)line;
    throw std::runtime_error(std::string("fake c10: ") + func + ": " + msg);
}
} // namespace detail
} // namespace c10
