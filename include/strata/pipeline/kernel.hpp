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
/// out; the pipeline copies the state.) The pipeline holds its kernel as a `kernel_ref`: a
/// reference to the caller's object and one table of functions per kernel type, so that its
/// machinery is compiled once per executor rather than once per kernel (a call per subgroup
/// costs nothing).

#include <cstddef>
#include <span>

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

/// A non-owning reference to a host_kernel (and its device half, when it has one) for executor
/// `Exec`: the kernel must outlive it. Copyable; two pointers.
template <class Exec>
class kernel_ref {
  using stream_t = typename Exec::stream_type;

 public:
  template <host_kernel K>
  explicit kernel_ref(K& k) noexcept : self_(&k), table_(&table_of<K>) {}

  void host(std::size_t s, std::span<std::byte> slot) const { table_->host(self_, s, slot); }
  void committed(std::size_t s) const { table_->committed(self_, s); }
  /// Whether the kernel can update on the device (device_kernel<K, Exec>).
  [[nodiscard]] bool has_device() const noexcept { return table_->device_update != nullptr; }
  void device_in(std::size_t s, std::span<std::byte> slot, std::span<std::byte> dev, stream_t& h2d) const {
    table_->device_in(self_, s, slot, dev, h2d);
  }
  void device_update(std::size_t s, std::span<std::byte> dev, Exec& e) const { table_->device_update(self_, s, dev, e); }
  void device_out(std::size_t s, std::span<std::byte> dev, stream_t& d2h) const {
    table_->device_out(self_, s, dev, d2h);
  }

 private:
  struct table {
    void (*host)(void*, std::size_t, std::span<std::byte>);
    void (*committed)(void*, std::size_t);
    void (*device_in)(void*, std::size_t, std::span<std::byte>, std::span<std::byte>, stream_t&);
    void (*device_update)(void*, std::size_t, std::span<std::byte>, Exec&);
    void (*device_out)(void*, std::size_t, std::span<std::byte>, stream_t&);
  };

  template <class K>
  static constexpr table table_of = [] {
    table t{[](void* p, std::size_t s, std::span<std::byte> slot) { static_cast<K*>(p)->host(s, slot); },
            [](void* p, std::size_t s) { static_cast<K*>(p)->committed(s); }, nullptr, nullptr, nullptr};
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
  }();

  void* self_;
  const table* table_;
};

}  // namespace strata
