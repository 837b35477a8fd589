// Must NOT compile: a size literal that is not a whole number of bytes is a compile-time error.
#include "strata/core/units.hpp"
using namespace strata::literals;
int main() { return static_cast<int>(0.1_KiB); }
