// A fresh directory under /tmp for one test, removed with everything in it afterwards; tests of
// node_limiter use their own so that parallel runs (other build trees too) never share a limiter.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace strata_test {

class temp_dir {
 public:
  temp_dir() {
    std::string tmpl = "/tmp/strata-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::system_error(errno, std::generic_category(), "mkdtemp");
    path_ = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace strata_test
