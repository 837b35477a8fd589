#pragma once
// strata::faulty injects faults into a tier (tier/faulty.hpp) or a stream (exec/faulty_stream.hpp):
// one name, two constrained partial specializations of this declaration.

namespace strata {

/// Fault injection around `Inner`, a tier or a stream; see the headers of each specialization.
template <class Inner>
class faulty;

}  // namespace strata
