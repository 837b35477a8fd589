#pragma once
/// An update rule on an executor's device: `enqueue_update<R>(exec, view, at, n, grads, model_out,
/// k)` enqueues the update of parameters [at, at + n) of a state in the executor's device memory
/// on its compute stream, the same bits as R::update_cpu on the same inputs. Executors know no
/// optimizer and rules know no executor; this header is where they meet:
/// - host_executor<S>: the rule's CPU kernel as the executor's "device" kernel (launch), paced to
///   its kernel rate; every rule;
/// - basic_cuda_executor<S> (in .cu files, compiled by nvcc): `cuda_update<R>::launch`, which
///   the rule's .cuh header defines (optim/adamw_cuda.cuh, adamw_8bit_cuda.cuh, sgd_cuda.cuh, lion_cuda.cuh), on the
///   native compute stream; a rule without one has no CUDA overload and updates on the host.
/// `rule_executor<E, R>` says whether an executor can run rule R.

#include <cstddef>

#include "strata/core/config.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/update_rule.hpp"

#if STRATA_HAS_CUDA && defined(__CUDACC__)
#include "strata/exec/cuda_executor.cuh"
// Every shipped rule's kernel, so that an optimizer of any of them compiles to the same code in
// every CUDA translation unit (one that included fewer would update those rules on the host).
#include "strata/optim/adamw_8bit_cuda.cuh"
#include "strata/optim/adamw_cuda.cuh"
#include "strata/optim/lion_cuda.cuh"
#include "strata/optim/sgd_cuda.cuh"
#endif

namespace strata {

/// R's CPU kernel over `v` (host memory: the executor's device memory), on exec's compute stream.
template <update_rule R, class S, gradient_type G, model_copy_type H>
void enqueue_update(host_executor<S>& exec, const state_view& v, std::size_t at, std::size_t n, const G* grads,
                    H* model_out, const typename R::step_params& k) {
  exec.launch(n, [v, at, n, grads, model_out, k](thread_pool* pool) {
    R::template update_cpu<G, H>(v, at, n, grads, model_out, k, pool);
  });
}

#if STRATA_HAS_CUDA && defined(__CUDACC__)
/// R's CUDA kernel over `v` (exec's device memory), launched on its compute stream.
template <update_rule R, class S, gradient_type G, model_copy_type H>
  requires requires(const state_view& v, const typename R::step_params& k, cudaStream_t s) {
    cuda_update<R>::template launch<G, H>(v, std::size_t{}, std::size_t{}, static_cast<const G*>(nullptr),
                                          static_cast<H*>(nullptr), k, s);
  }
void enqueue_update(basic_cuda_executor<S>& exec, const state_view& v, std::size_t at, std::size_t n, const G* grads,
                    H* model_out, const typename R::step_params& k) {
  exec.launch([&](cudaStream_t native) { cuda_update<R>::template launch<G, H>(v, at, n, grads, model_out, k, native); });
}
#endif

/// An executor that can run rule R's updates: enqueue_update<R> has an overload for it (for
/// every gradient type with a 16-bit model copy).
template <class E, class R>
concept rule_executor =
    executor<E> && update_rule<R> &&
    requires(E& e, const state_view& v, const typename R::step_params& k) {
      enqueue_update<R>(e, v, std::size_t{}, std::size_t{}, static_cast<const float*>(nullptr),
                        static_cast<bf16*>(nullptr), k);
      enqueue_update<R>(e, v, std::size_t{}, std::size_t{}, static_cast<const bf16*>(nullptr),
                        static_cast<bf16*>(nullptr), k);
      enqueue_update<R>(e, v, std::size_t{}, std::size_t{}, static_cast<const fp16*>(nullptr),
                        static_cast<fp16*>(nullptr), k);
    };

}  // namespace strata
