// XLA FFI handlers for 2-D matrix products on the CPU through the BLAS that PyTorch's
// CPU build ships (NOTE [Matrix products through PyTorch's BLAS] in ffi/_cpu_blas.py).
// The BLAS routines are Fortran's sgemm_/dgemm_ (LP64, column-major); their addresses
// are handed in by tj_set_blas before the first call.
#include <algorithm>
#include <cstdint>

#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

template <typename T>
using gemm_fn = void (*)(const char*, const char*, const int*, const int*, const int*, const T*, const T*,
                         const int*, const T*, const int*, const T*, T*, const int*);
using set_threads_fn = int (*)(int);

static gemm_fn<float> sgemm = nullptr;
static gemm_fn<double> dgemm = nullptr;
static set_threads_fn set_local_threads = nullptr;

extern "C" void tj_set_blas(void* s, void* d, void* local_threads) {
  sgemm = reinterpret_cast<gemm_fn<float>>(s);
  dgemm = reinterpret_cast<gemm_fn<double>>(d);
  set_local_threads = reinterpret_cast<set_threads_fn>(local_threads);
}

// Below this many multiply-adds a product runs as one BLAS call on the calling thread;
// above, one block per 2^21 of them, at most one per thread (four per thread measured
// slower: 128x784 @ 784x784 in 780 against 600 us), each of 32 rows or columns at least.
constexpr int64_t kSplitWork = int64_t{1} << 21;
constexpr int64_t kBlocksPerThread = 1;
constexpr int kMinBlock = 32;

// Row-major C (M x N) = op(A) @ op(B), where A is M x K (K x M when trans_a) and B is
// K x N (N x K when trans_b). Column-major, that is C^T = op(B)^T @ op(A)^T: the BLAS call
// takes B first. The caller guarantees M, N, K >= 1 and below 2^31.
//
// The BLAS runs single-threaded on XLA's own intra-op threads: the product is cut into
// blocks of C's rows (or columns, whichever C has more of). Letting the BLAS thread itself
// made each XLA thread the master of an OpenMP team of its own, and from then on PyTorch's
// own CPU ops in the same process ran ~1.6x slower (its MLP step 2.6 -> 4.3 ms, measured;
// libgomp likely throttles its spin-waiting once it manages more threads than cores).
// The blocks are shared out by tj::ParallelFor (parallel_for.h).
template <typename T>
static void GemmBlocks(gemm_fn<T> gemm, ffi::ThreadPool pool, const T* a, const T* b, T* c, int m, int n, int k,
                       bool trans_a, bool trans_b) {
  const int lda = trans_a ? m : k, ldb = trans_b ? k : n, ldc = n;
  const bool by_rows = m >= n;
  const int extent = by_rows ? m : n;
  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  int64_t blocks = std::min<int64_t>(threads * kBlocksPerThread, std::max<int64_t>(1, int64_t{m} * n * k / kSplitWork));
  blocks = std::min<int64_t>(blocks, std::max(1, extent / kMinBlock));
  auto run = [=](int64_t i) {
    const int lo = static_cast<int>(extent * i / blocks), hi = static_cast<int>(extent * (i + 1) / blocks);
    const int len = hi - lo;
    const T one = 1, zero = 0;
    int previous = set_local_threads(1);
    if (by_rows) {  // rows lo..hi of C: of op(A) as well
      const T* a_block = trans_a ? a + lo : a + int64_t{lo} * k;
      gemm(trans_b ? "T" : "N", trans_a ? "T" : "N", &n, &len, &k, &one, b, &ldb, a_block, &lda, &zero,
           c + int64_t{lo} * n, &ldc);
    } else {  // columns lo..hi of C: of op(B) as well
      const T* b_block = trans_b ? b + int64_t{lo} * k : b + lo;
      gemm(trans_b ? "T" : "N", trans_a ? "T" : "N", &len, &m, &k, &one, b_block, &ldb, a, &lda, &zero, c + lo,
           &ldc);
    }
    set_local_threads(previous);
  };
  tj::ParallelFor(pool, blocks, blocks, run);
}

template <typename T, ffi::DataType D>
static ffi::Error Gemm(gemm_fn<T> gemm, ffi::ThreadPool pool, ffi::Buffer<D> a, ffi::Buffer<D> b,
                       ffi::ResultBuffer<D> c, int32_t trans_a, int32_t trans_b) {
  if (gemm == nullptr || set_local_threads == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "torch_jax: BLAS not set");
  }
  auto cd = c->dimensions();
  auto ad = a.dimensions();
  const int m = static_cast<int>(cd[0]), n = static_cast<int>(cd[1]);
  const int k = static_cast<int>(trans_a ? ad[0] : ad[1]);
  GemmBlocks<T>(gemm, pool, a.typed_data(), b.typed_data(), c->typed_data(), m, n, k, trans_a, trans_b);
  return ffi::Error::Success();
}

static ffi::Error GemmF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                          ffi::ResultBuffer<ffi::F32> c, int32_t trans_a, int32_t trans_b) {
  return Gemm<float, ffi::F32>(sgemm, pool, a, b, c, trans_a, trans_b);
}

static ffi::Error GemmF64(ffi::ThreadPool pool, ffi::Buffer<ffi::F64> a, ffi::Buffer<ffi::F64> b,
                          ffi::ResultBuffer<ffi::F64> c, int32_t trans_a, int32_t trans_b) {
  return Gemm<double, ffi::F64>(dgemm, pool, a, b, c, trans_a, trans_b);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(tj_gemm_f32, GemmF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("trans_a")
                                  .Attr<int32_t>("trans_b"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(tj_gemm_f64, GemmF64,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<int32_t>("trans_a")
                                  .Attr<int32_t>("trans_b"));
