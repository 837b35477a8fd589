// Must NOT compile: a size literal that overflows 64 bits is a compile-time error.
#include "strata/core/units.hpp"
using namespace strata::literals;
int main() { return static_cast<int>(17179869184_GiB); }
