// Must NOT compile: a pipeline whose executor parameter is not a strata::executor.
#include <strata/pipeline/subgroup_pipeline.hpp>
struct not_an_executor {};
int main() {
  using P = strata::subgroup_pipeline<not_an_executor>;
  return sizeof(P) > 0 ? 0 : 1;
}
