#pragma once
/// Checkpoints of offloaded_adamw in a tier instead of a directory: an object store (an
/// object_store_tier on its own prefix), or any other tier stack. The manifest format is
/// checkpoint_manifest's, so every byte is verified on the way back as with files.
///
/// Layout in the store, for a save of step n:
///   state-<n>-<16 hex>.<s>     subgroup s's state, one object per subgroup, each written whole
///   manifest-<n>-<16 hex>      the manifest naming them (data = "state-<n>-<16 hex>")
///   checkpoint                 a pointer of fixed size naming the current manifest (and a save in
///                              progress), rewritten whole, never shorter: on S3 each rewrite is
///                              one PUT that replaces it at once.
/// Crash safety: the pointer names the new manifest only after every part and the manifest were
/// confirmed (written and flushed), so a crash or failure at any point leaves the previous
/// checkpoint loadable. The pointer names a save in progress first, so the next save removes
/// what a killed one left; the replaced checkpoint's objects go once the pointer moved on. Only
/// objects of these forms, named by the pointer, are ever removed.
/// A load with a missing or damaged part, manifest or pointer is an integrity_error.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "strata/core/checksum.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/offload/checkpoint_manifest.hpp"
#include "strata/tier/any_tier.hpp"

namespace strata {

namespace detail {

/// The pointer object: "strata-checkpoint-pointer 1\ncurrent <manifest>\npending <base>\n
/// checksum <hex>\n", padded with spaces to a fixed size so a rewrite never shrinks it.
struct checkpoint_pointer {
  static constexpr std::string_view object = "checkpoint";
  static constexpr std::string_view magic = "strata-checkpoint-pointer 1";
  static constexpr std::size_t size = 512;
  std::string current;  ///< manifest object of the loadable checkpoint ("-": none)
  std::string pending;  ///< base name of a save in progress ("-": none)

  [[nodiscard]] std::string to_text() const {
    std::string body = fmt::format("{}\ncurrent {}\npending {}\n", magic, current.empty() ? "-" : current,
                                   pending.empty() ? "-" : pending);
    body += fmt::format("checksum {:#018x}\n", checksum64(std::as_bytes(std::span(body.data(), body.size()))));
    STRATA_EXPECTS(body.size() <= size, config_error, "checkpoint pointer of {} bytes is over {}", body.size(), size);
    body.resize(size, ' ');
    return body;
  }

  [[nodiscard]] static checkpoint_pointer parse(std::string_view text, std::string_view where) {
    const auto bad = [&](std::string_view why) { return integrity_error("checkpoint", where, 0, why); };
    const auto sum_at = text.find("checksum ");
    if (!text.starts_with(magic) || sum_at == std::string_view::npos) throw bad("not a checkpoint pointer");
    const auto body = text.substr(0, sum_at);
    const auto eol = text.find('\n', sum_at);
    if (eol == std::string_view::npos) throw bad("the pointer is truncated");
    const std::string want = fmt::format("{:#018x}", checksum64(std::as_bytes(std::span(body.data(), body.size()))));
    if (text.substr(sum_at + 9, eol - sum_at - 9) != want) throw bad("the pointer's checksum does not match");
    checkpoint_pointer p;
    const auto field = [&](std::string_view key) {
      const std::string head = fmt::format("\n{} ", key);
      const auto at = body.find(head);
      if (at == std::string_view::npos) throw bad(fmt::format("the pointer has no '{}'", key));
      const auto from = at + head.size();
      std::string v(body.substr(from, body.find('\n', from) - from));
      return v == "-" ? std::string() : v;
    };
    p.current = field("current");
    p.pending = field("pending");
    return p;
  }
};

inline std::string read_store_object(any_tier& store, std::string_view object, std::string_view what) {
  const auto n = store.size(object);
  if (!n) throw integrity_error("checkpoint", fmt::format("{}/{}", store.name(), object), 0, fmt::format("{} is missing", what));
  std::string text(static_cast<std::size_t>(*n), '\0');
  store.read(object, 0, std::as_writable_bytes(std::span(text.data(), text.size()))).get();
  return text;
}

inline std::optional<checkpoint_pointer> read_pointer(any_tier& store) {
  if (!store.size(checkpoint_pointer::object)) return std::nullopt;
  return checkpoint_pointer::parse(read_store_object(store, checkpoint_pointer::object, "the checkpoint pointer"),
                                   fmt::format("{}/{}", store.name(), checkpoint_pointer::object));
}

inline void write_pointer(any_tier& store, const checkpoint_pointer& p) {
  const std::string text = p.to_text();
  store.write(checkpoint_pointer::object, 0, std::as_bytes(std::span(text.data(), text.size()))).get();
  store.flush();
}

/// Whether `name` has the form "<head><step>-<16 hex>" that a save names its objects with.
[[nodiscard]] inline bool is_store_checkpoint_name(std::string_view name, std::string_view head) {
  if (!name.starts_with(head)) return false;
  const auto rest = name.substr(head.size());
  const auto dash = rest.find('-');
  if (dash == 0 || dash == std::string_view::npos || rest.size() - dash - 1 != 16) return false;
  for (char c : rest.substr(0, dash))
    if (c < '0' || c > '9') return false;
  for (char c : rest.substr(dash + 1))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Removes the objects of a save whose data base is `base`: its parts (written in order from 0,
// so up to the first absent one) and its manifest. Best effort: what stays is named again by
// no pointer, so it is only ever left, never taken for something else.
inline void remove_store_checkpoint(any_tier& store, const std::string& base) noexcept {
  try {
    if (!is_store_checkpoint_name(base, "state-")) return;
    for (std::size_t s = 0; store.remove(fmt::format("{}.{}", base, s)); ++s) {
    }
    store.remove("manifest-" + base.substr(6));
  } catch (...) {
  }
}

}  // namespace detail

/// Writes a checkpoint into `store` (see the file comment): `m` gives step, layout and options;
/// `visit(fn)` must call fn(s, std::span<const std::byte> state) for every subgroup s in order.
template <class Visit>
void write_checkpoint(any_tier& store, checkpoint_manifest m, std::size_t subgroups, Visit&& visit) {
  const auto old = detail::read_pointer(store);
  if (old && !old->pending.empty()) detail::remove_store_checkpoint(store, old->pending);  // a killed save's
  std::random_device rd;
  const std::string id = fmt::format("{}-{:08x}{:08x}", m.step, rd(), rd());
  m.data_file = "state-" + id;
  const std::string manifest_object = "manifest-" + id;
  detail::checkpoint_pointer p{old ? old->current : std::string(), m.data_file};
  detail::write_pointer(store, p);
  try {
    m.checksums.assign(subgroups, 0);
    m.subgroup_bytes.assign(subgroups, 0);
    std::size_t expected = 0;
    std::uint64_t total = 0;
    visit([&](std::size_t s, std::span<const std::byte> bytes) {
      STRATA_ASSERT(s == expected);
      ++expected;
      m.checksums[s] = checksum64(bytes);
      m.subgroup_bytes[s] = bytes.size();
      store.write(fmt::format("{}.{}", m.data_file, s), 0, bytes).get();
      total += bytes.size();
    });
    m.data_bytes = total;
    const std::string text = m.to_text();
    store.write(manifest_object, 0, std::as_bytes(std::span(text.data(), text.size()))).get();
    store.flush();
  } catch (...) {
    detail::remove_store_checkpoint(store, m.data_file);
    try {
      detail::write_pointer(store, {p.current, {}});
    } catch (...) {  // the pointer still names this save as pending: the next save clears it
    }
    throw;
  }
  detail::write_pointer(store, {manifest_object, {}});
  if (old && !old->current.empty() && detail::is_store_checkpoint_name(old->current, "manifest-"))
    detail::remove_store_checkpoint(store, "state-" + old->current.substr(9));
}

/// The manifest of the checkpoint in `store`; integrity_error when there is none or it is damaged.
[[nodiscard]] inline checkpoint_manifest read_checkpoint_manifest(any_tier& store) {
  const auto p = detail::read_pointer(store);
  if (!p || p->current.empty())
    throw integrity_error("checkpoint", fmt::format("{}/{}", store.name(), detail::checkpoint_pointer::object), 0,
                          "no checkpoint was saved here");
  return checkpoint_manifest::parse(detail::read_store_object(store, p->current, "the manifest"),
                                    fmt::format("{}/{}", store.name(), p->current));
}

/// Reads the subgroups of a checkpoint in a store back, each checked for its size and checksum.
class store_checkpoint_reader {
 public:
  template <class StateBytes>
  store_checkpoint_reader(any_tier& store, checkpoint_manifest m, std::size_t subgroups, StateBytes&& state_bytes)
      : store_(&store), manifest_(std::move(m)) {
    if (manifest_.subgroup_bytes.size() != subgroups)
      throw integrity_error("checkpoint", where(0), 0, "subgroup count does not match the layout");
    for (std::size_t s = 0; s < subgroups; ++s)
      if (manifest_.subgroup_bytes[s] != state_bytes(s))
        throw integrity_error("checkpoint", where(s), 0,
                              fmt::format("subgroup {} has {} bytes, the layout needs {}", s, manifest_.subgroup_bytes[s],
                                          state_bytes(s)));
  }

  /// Fills `dst` (the subgroup's size) with subgroup `s`'s state; integrity_error when its
  /// object is missing, has another size or another checksum.
  void read(std::size_t s, std::span<std::byte> dst) const {
    const std::string object = fmt::format("{}.{}", manifest_.data_file, s);
    const auto n = store_->size(object);
    if (!n || *n != manifest_.subgroup_bytes.at(s))
      throw integrity_error("checkpoint", where(s), 0,
                            n ? fmt::format("the part has {} bytes, the manifest says {}", *n, manifest_.subgroup_bytes[s])
                              : std::string("the part is missing"));
    store_->read(object, 0, dst).get();
    const auto sum = checksum64(dst);
    if (sum != manifest_.checksums[s]) throw integrity_error("checkpoint", where(s), 0, manifest_.checksums[s], sum);
  }
  [[nodiscard]] const checkpoint_manifest& manifest() const noexcept { return manifest_; }

 private:
  [[nodiscard]] std::string where(std::size_t s) const {
    return fmt::format("{}/{}.{} (subgroup {})", store_->name(), manifest_.data_file, s, s);
  }
  any_tier* store_;
  checkpoint_manifest manifest_;
};

/// Reads every byte of the checkpoint in `store` against the manifest, loading it nowhere.
inline checkpoint_manifest verify_checkpoint(any_tier& store) {
  auto m = read_checkpoint_manifest(store);
  const std::size_t subgroups = m.subgroup_bytes.size();
  const store_checkpoint_reader reader(store, m, subgroups, [&](std::size_t s) { return m.subgroup_bytes[s]; });
  std::vector<std::byte> buf;
  for (std::size_t s = 0; s < subgroups; ++s) {
    buf.resize(static_cast<std::size_t>(m.subgroup_bytes[s]));
    reader.read(s, buf);
  }
  return m;
}

/// Removes the checkpoint in `store` (a retention policy's older one): the objects its pointer
/// names (the current save's parts and manifest, and what a killed save left), then the pointer
/// itself. Objects of other forms stay. Returns whether there was a checkpoint.
inline bool remove_checkpoint(any_tier& store) {
  const auto p = detail::read_pointer(store);
  if (!p) return false;
  if (!p->pending.empty()) detail::remove_store_checkpoint(store, p->pending);
  if (!p->current.empty() && p->current.starts_with("manifest-"))
    detail::remove_store_checkpoint(store, "state-" + p->current.substr(9));
  (void)store.remove(std::string(detail::checkpoint_pointer::object));
  return true;
}

}  // namespace strata
