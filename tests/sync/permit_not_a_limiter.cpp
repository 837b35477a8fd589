// Must NOT compile: a permit needs a limiter, and a type without release() is not one.
#include "strata/sync/limiter.hpp"

struct no_release {
  void acquire() {}
  bool try_acquire() { return true; }
};

int main() {
  no_release l;
  strata::permit<no_release> p(l);
  return p.owns() ? 0 : 1;
}
