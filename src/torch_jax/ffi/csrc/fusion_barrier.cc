// An XLA FFI handler that does nothing: the fusion barrier of ffi/_fusion_barrier.py
// (NOTE [Fusion barriers on XLA:CPU] there). Its result aliases its operand, so XLA
// computes the operand once into the buffer that every reader then reads; the copy below
// runs only if XLA ever hands it two buffers.
#include <cstring>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error Barrier(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (x.untyped_data() != y->untyped_data()) std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(tj_fusion_barrier, Barrier, ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
