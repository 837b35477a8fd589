// Must NOT compile: cache_index needs an eviction_policy, and a type without victim() is not one.
#include <cstddef>

#include "strata/policy/cache_index.hpp"

struct remembers_nothing {
  void on_insert(std::size_t) {}
};

int main() {
  strata::cache_index<remembers_nothing> cache(4);
  return static_cast<int>(cache.size());
}
