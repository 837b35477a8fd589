// README's usage example: strata's core in a few lines (a ctest keeps README and this file equal).
#include <algorithm>
#include <future>
#include <vector>

#include <strata/strata.hpp>

int main() {
  using namespace strata::literals;
  strata::tracer tracer;                                     // spans per thread, Chrome trace JSON
  strata::thread_pool pool(4, "quickstart");                 // fixed pool; futures carry results
  strata::direct_io_buffer buf(strata::parse_size("3MiB"));  // 4096-aligned, padded for O_DIRECT

  std::vector<std::future<std::size_t>> parts;
  for (std::size_t off = 0; off < buf.size(); off += 1_MiB)
    parts.push_back(pool.submit([&, off] {
      strata::trace_span span(&tracer, "fill");
      span.arg("offset", off);
      std::fill_n(buf.data() + off, 1_MiB, std::byte{0x5a});
      return std::size_t{1_MiB};
    }));
  std::size_t filled = 0;
  for (auto& p : parts) filled += p.get();  // a task's exception would be rethrown here

  fmt::print("filled {}\n{}", strata::format_size(filled), tracer.summary().snapshot().to_string());
  tracer.write_chrome_trace("quickstart.trace.json");  // open in ui.perfetto.dev
}
