// Must NOT compile: an adaptor over something that is not a tier.
#include <strata/tier/throttled.hpp>
int main() {
  strata::throttled<int> t(strata::throttle_options{});
  (void)t;
}
