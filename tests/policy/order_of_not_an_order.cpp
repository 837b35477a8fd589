// Must NOT compile: order_of needs an update_order.
#include "strata/policy/update_order.hpp"

struct shuffled {};

int main() { return static_cast<int>(strata::order_of(shuffled{}, 0, 4).size()); }
