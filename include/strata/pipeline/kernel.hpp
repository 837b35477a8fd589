#pragma once
/// What a subgroup pipeline runs on each subgroup: a kernel. For subgroup `s` (`slot`: its bytes
/// of the host slot, the state then its side object (at pipeline_object::aux_offset); `device`: the whole device slot, the state
/// then `device_extra_bytes` of scratch):
///
///   void host(std::size_t s, std::span<std::byte> slot);   on the pipeline's CPU worker; it must
///                                                           either throw before changing the
///                                                           state or not throw
///   void committed(std::size_t s);                          on the driving thread, once the
///                                                           update is in
///
/// and, when the site policy may choose the device (`device_kernel`):
///
///   void device_in(std::size_t s, std::span<std::byte> slot, std::span<std::byte> device, stream&);
///   void device_update(std::size_t s, std::span<std::byte> device, Exec&);   enqueue on compute
///   void device_out(std::size_t s, std::span<std::byte> device, stream&);
///
/// (device_in/out enqueue the kernel's own copies, e.g. gradients in and a 16-bit model copy
/// out; the pipeline copies the state.) A kernel that can take over a speculative update
/// (subgroup_pipeline::run_speculative; `adopting_kernel`) also has
///
///   void adopted(std::size_t s, std::span<std::byte> slot);   on the CPU worker: `slot` holds
///                                                              the update another kernel of
///                                                              the same constants made; do what
///                                                              host() does besides the state
///                                                              (e.g. write the model copy) The pipeline holds its kernel as a `kernel_ref`: a
/// reference to the caller's object and one table of functions per kernel type, so that its
/// machinery is compiled once per executor rather than once per kernel (a call per subgroup
/// costs nothing). `any_kernel` owns one (core/erased.hpp: the erasure pair every concept has).

#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/core/erased.hpp"

namespace strata {

/// A kernel that updates a subgroup in its host slot (see the file comment).
template <class K>
concept host_kernel = requires(K& k, std::size_t s, std::span<std::byte> slot) {
  k.host(s, slot);
  k.committed(s);
};

/// A kernel that can also update a subgroup in `Exec`'s device memory.
template <class K, class Exec>
concept device_kernel =
    host_kernel<K> && requires(K& k, std::size_t s, std::span<std::byte> slot, std::span<std::byte> dev, Exec& e) {
      k.device_in(s, slot, dev, e.h2d());
      k.device_update(s, dev, e);
      k.device_out(s, dev, e.d2h());
    };

/// A host kernel that can take over a speculative update of a subgroup (see the file comment).
template <class K>
concept adopting_kernel = host_kernel<K> && requires(K& k, std::size_t s, std::span<std::byte> slot) {
  k.adopted(s, slot);
};

namespace detail {

/// The table of a kernel for executor Exec (core/erased.hpp); the device entries are null for a
/// kernel that only updates on the host.
template <class Exec>
struct kernel_table {
  using stream_t = typename Exec::stream_type;
  static constexpr std::string_view concept_name = "kernel";
  erased_ops ops_;
  void (*host)(void*, std::size_t, std::span<std::byte>);
  void (*committed)(void*, std::size_t);
  void (*adopted)(void*, std::size_t, std::span<std::byte>);
  void (*device_in)(void*, std::size_t, std::span<std::byte>, std::span<std::byte>, stream_t&);
  void (*device_update)(void*, std::size_t, std::span<std::byte>, Exec&);
  void (*device_out)(void*, std::size_t, std::span<std::byte>, stream_t&);
  [[nodiscard]] const erased_ops& ops() const noexcept { return ops_; }

  template <class K>
  static constexpr kernel_table of() {
    kernel_table t{erased_ops_of<K>,
                   [](void* p, std::size_t s, std::span<std::byte> slot) { static_cast<K*>(p)->host(s, slot); },
                   [](void* p, std::size_t s) { static_cast<K*>(p)->committed(s); }, nullptr, nullptr, nullptr,
                   nullptr};
    if constexpr (adopting_kernel<K>)
      t.adopted = [](void* p, std::size_t s, std::span<std::byte> slot) { static_cast<K*>(p)->adopted(s, slot); };
    if constexpr (device_kernel<K, Exec>) {
      t.device_in = [](void* p, std::size_t s, std::span<std::byte> slot, std::span<std::byte> dev, stream_t& st) {
        static_cast<K*>(p)->device_in(s, slot, dev, st);
      };
      t.device_update = [](void* p, std::size_t s, std::span<std::byte> dev, Exec& e) {
        static_cast<K*>(p)->device_update(s, dev, e);
      };
      t.device_out = [](void* p, std::size_t s, std::span<std::byte> dev, stream_t& st) {
        static_cast<K*>(p)->device_out(s, dev, st);
      };
    }
    return t;
  }
};
template <class K, class Exec>
inline constexpr kernel_table<Exec> kernel_table_of = kernel_table<Exec>::template of<K>();

/// A kernel's members, written once for kernel_ref and any_kernel.
template <class D, class Exec>
class kernel_calls {
  using stream_t = typename Exec::stream_type;

 public:
  void host(std::size_t s, std::span<std::byte> slot) const { t().host(self(), s, slot); }
  void committed(std::size_t s) const { t().committed(self(), s); }
  /// Whether the kernel can take over a speculative update (adopting_kernel<K>).
  [[nodiscard]] bool can_adopt() const noexcept { return t().adopted != nullptr; }
  void adopted(std::size_t s, std::span<std::byte> slot) const { t().adopted(self(), s, slot); }
  /// Whether the kernel can update on the device (device_kernel<K, Exec>).
  [[nodiscard]] bool has_device() const noexcept { return t().device_update != nullptr; }
  void device_in(std::size_t s, std::span<std::byte> slot, std::span<std::byte> dev, stream_t& h2d) const {
    t().device_in(self(), s, slot, dev, h2d);
  }
  void device_update(std::size_t s, std::span<std::byte> dev, Exec& e) const { t().device_update(self(), s, dev, e); }
  void device_out(std::size_t s, std::span<std::byte> dev, stream_t& d2h) const { t().device_out(self(), s, dev, d2h); }

 private:
  [[nodiscard]] void* self() const { return static_cast<const D*>(this)->erased_self(); }
  [[nodiscard]] const kernel_table<Exec>& t() const noexcept { return static_cast<const D*>(this)->erased_table(); }
};

}  // namespace detail

template <class Exec>
class any_kernel;

/// A non-owning reference to a host_kernel (and its device half, when it has one) for executor
/// `Exec`: the kernel must outlive it. Copyable; two pointers.
template <class Exec>
class kernel_ref : public detail::kernel_calls<kernel_ref<Exec>, Exec> {
 public:
  template <host_kernel K>
    requires(!std::same_as<K, kernel_ref> && !std::same_as<K, any_kernel<Exec>>)
  explicit kernel_ref(K& k) noexcept : ref_(&k, detail::kernel_table_of<K, Exec>) {}
  kernel_ref(void* self, const detail::kernel_table<Exec>& t) noexcept : ref_(self, t) {}
  /// The kernel if it is a K, else null.
  template <class K>
  [[nodiscard]] K* target() const noexcept {
    return ref_.template target<K>();
  }

 private:
  friend class detail::kernel_calls<kernel_ref, Exec>;
  [[nodiscard]] void* erased_self() const noexcept { return ref_.self(); }
  [[nodiscard]] const detail::kernel_table<Exec>& erased_table() const noexcept { return ref_.table(); }
  detail::erased_ref<detail::kernel_table<Exec>> ref_;
};

/// An owning, move-only kernel for executor `Exec` (core/erased.hpp), for a pipeline whose
/// kernel is chosen at run time and kept with it.
template <class Exec>
class any_kernel : public detail::kernel_calls<any_kernel<Exec>, Exec> {
 public:
  /// Owns `k` (any host_kernel but an any_kernel).
  template <host_kernel K>
    requires(!std::same_as<std::remove_cvref_t<K>, any_kernel>)
  explicit any_kernel(K k) : box_(std::make_unique<K>(std::move(k)), detail::kernel_table_of<K, Exec>) {}
  any_kernel(any_kernel&&) noexcept = default;
  any_kernel& operator=(any_kernel&&) noexcept = default;
  /// The kernel if it is a K, else null.
  template <class K>
  [[nodiscard]] K* target() const noexcept {
    return box_.template target<K>();
  }
  /// A reference to the kernel held (what a pipeline's pass takes).
  [[nodiscard]] kernel_ref<Exec> ref() const { return {box_.self(), box_.table()}; }

 private:
  friend class detail::kernel_calls<any_kernel, Exec>;
  [[nodiscard]] void* erased_self() const { return box_.self(); }
  [[nodiscard]] const detail::kernel_table<Exec>& erased_table() const noexcept { return box_.table(); }
  detail::erased_box<detail::kernel_table<Exec>> box_;
};

}  // namespace strata
