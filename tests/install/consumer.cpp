// The C consumer (consumer.c) compiled as C++17: the header's C++ compatibility from
// an installed prefix.
#include "consumer.c"
