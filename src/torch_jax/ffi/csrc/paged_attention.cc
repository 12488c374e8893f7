// An XLA FFI handler for ragged paged attention on the CPU, float32 (NOTE [Paged attention
// on XLA:CPU] in kernels/_paged.py): the same arguments and result as the jnp version
// there, each key and value read once from the cache where it lies, with no gathered copy.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kQueryTile = 16;  // a work item's query tokens: consecutive ones of one sequence

struct Args {
  const float* query;  // (T, Hq, D)
  const float* cache;  // (NB, Hkv, BS, 2D): a position's key, then its value
  const int32_t* starts;  // (S + 1,) query_start_loc
  const int32_t* lens;  // (S,) seq_lens
  const int32_t* table;  // (S, W) block_table
  float* out;  // (T, Hq, D)
  int64_t tokens, q_heads, dim, blocks, kv_heads, block_size, width;
  float scale, soft_cap;
  int32_t window;
};

struct Item {  // query tokens [t0, t1) of sequence s, key/value head h
  int64_t s, t0, t1, h;
};

// exp(x) for x <= 0 in float32, in a form the compiler vectorizes (libm's expf is a call a
// score): 2^n times a polynomial of the remainder r = x - n ln 2, |r| <= ln(2) / 2 (Cephes'
// expf coefficients, ln 2 split in two parts). Within 1 ulp of exp in float64 at every
// float of [-87, 0] (checked one by one; libm's: 0.5); below -87, ~1e-38 rather than 0.
// (Inlined where called: the callers are built for two instruction sets, target_clones.)
#define TJ_INLINE __attribute__((always_inline)) inline

TJ_INLINE float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return e * scale;
}

// Scores of query q against the keys at k[0..n) (each of D floats), four keys a pass: four
// independent sums, where one dot product at a time waits on its own sum at each step.
TJ_INLINE void Scores(const float* __restrict q, const float* const* k, int64_t n, int64_t D, float* __restrict out) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *k0 = k[j], *k1 = k[j + 1], *k2 = k[j + 2], *k3 = k[j + 3];
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t d = 0; d < D; ++d) {
      s0 += q[d] * k0[d];
      s1 += q[d] * k1[d];
      s2 += q[d] * k2[d];
      s3 += q[d] * k3[d];
    }
    out[j] = s0, out[j + 1] = s1, out[j + 2] = s2, out[j + 3] = s3;
  }
  for (; j < n; ++j) {
    const float* k0 = k[j];
    float s0 = 0;
#pragma omp simd reduction(+ : s0)
    for (int64_t d = 0; d < D; ++d) s0 += q[d] * k0[d];
    out[j] = s0;
  }
}

// acc += sum of w[j] * v[j] over j in [0, n) (the values at k[j] + D, each of D floats: a
// position's value follows its key), four a pass.
TJ_INLINE void WeightedSum(const float* w, const float* const* k, int64_t n, int64_t D, float* __restrict acc) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *v0 = k[j] + D, *v1 = k[j + 1] + D, *v2 = k[j + 2] + D, *v3 = k[j + 3] + D;
    const float w0 = w[j], w1 = w[j + 1], w2 = w[j + 2], w3 = w[j + 3];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] += w0 * v0[d] + w1 * v1[d] + w2 * v2[d] + w3 * v3[d];
  }
  for (; j < n; ++j) {
    const float* v0 = k[j] + D;
    const float w0 = w[j];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] += w0 * v0[d];
  }
}

// One item's rows: each of its tokens' query heads of head h's group, against the keys
// from the token's window's first position to its own (a range of the item's keys). Built
// twice, for AVX2 with FMA and for the baseline, the loader picking one for the machine
// (AVX2's: 1.2-1.5x faster, measured).
#if defined(__x86_64__)
#define TJ_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TJ_CLONES
#endif
TJ_CLONES void Attend(const Args& a, const Item& item, std::vector<float>& scratch, std::vector<const float*>& keys) {
  const int64_t D = a.dim, G = a.q_heads / a.kv_heads, BS = a.block_size;
  const int64_t end = a.starts[item.s + 1], len = a.lens[item.s];
  auto position = [&](int64_t t) { return len - (end - t); };  // (token t's; its window ends there)
  auto first_of = [&](int64_t pos) { return a.window > 0 ? std::max<int64_t>(pos - a.window + 1, 0) : int64_t{0}; };
  const int64_t last = position(item.t1 - 1);
  if (last < 0) return;  // (inconsistent lengths: no keys, zero rows, as in jnp)
  const int64_t lo = first_of(std::max<int64_t>(position(item.t0), 0)), n = last - lo + 1;
  keys.resize(n);
  for (int64_t j = 0; j < n; ++j) {  // (the key of each position; its value follows it)
    const int64_t pos = lo + j, b = std::min(pos / BS, a.width - 1);
    const int64_t block = std::clamp<int64_t>(a.table[item.s * a.width + b], 0, a.blocks - 1);  // (as jnp's gathers)
    keys[j] = a.cache + ((block * a.kv_heads + item.h) * BS + pos % BS) * 2 * D;
  }
  scratch.resize(D + n);
  float* q = scratch.data();  // (D,): a row's scaled query
  float* w = q + D;  // (n,): its scores, then the softmax's numerators
  for (int64_t t = item.t0; t < item.t1; ++t) {
    const int64_t own = position(t);
    if (own < 0) continue;
    const int64_t j0 = first_of(own) - lo, m = own - lo + 1 - j0;  // (its keys: j0 .. j0 + m)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t head = item.h * G + g;
      const float* src = a.query + (t * a.q_heads + head) * D;
      for (int64_t d = 0; d < D; ++d) q[d] = src[d] * a.scale;
      Scores(q, keys.data() + j0, m, D, w);
      if (a.soft_cap > 0) {
        for (int64_t j = 0; j < m; ++j) w[j] = a.soft_cap * std::tanh(w[j] / a.soft_cap);
      }
      float top = w[0], total = 0.0f;
      for (int64_t j = 1; j < m; ++j) top = std::max(top, w[j]);
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < m; ++j) {
        w[j] = ExpNonPositive(w[j] - top);
        total += w[j];
      }
      float* row = a.out + (t * a.q_heads + head) * D;  // (zeros: the output was cleared)
      WeightedSum(w, keys.data() + j0, m, D, row);
      for (int64_t d = 0; d < D; ++d) row[d] /= total;  // (total >= 1: the row's own key has weight 1)
    }
  }
}

ffi::Error PagedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> query, ffi::Buffer<ffi::F32> cache,
                          ffi::Buffer<ffi::S32> starts, ffi::Buffer<ffi::S32> lens, ffi::Buffer<ffi::S32> table,
                          ffi::Buffer<ffi::S32> num_seqs, ffi::ResultBuffer<ffi::F32> out, float scale,
                          int32_t window, float soft_cap) {
  auto qd = query.dimensions(), cd = cache.dimensions(), td = table.dimensions();
  Args a{query.typed_data(), cache.typed_data(), starts.typed_data(), lens.typed_data(), table.typed_data(),
         out->typed_data()};
  a.tokens = qd[0], a.q_heads = qd[1], a.dim = qd[2];
  a.blocks = cd[0], a.kv_heads = cd[1], a.block_size = cd[2], a.width = td[1];
  a.scale = scale, a.soft_cap = soft_cap, a.window = window;
  std::memset(a.out, 0, out->size_bytes());  // (padding tokens' rows stay zero)
  if (a.tokens == 0 || a.blocks == 0 || a.kv_heads == 0 || a.width == 0) return ffi::Error::Success();
  const int64_t n_seqs = std::clamp<int64_t>(num_seqs.typed_data()[0], 0, td[0]);
  std::vector<Item> items;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t t0 = std::max<int64_t>(a.starts[s], 0), t1 = std::min<int64_t>(a.starts[s + 1], a.tokens);
    for (int64_t t = t0; t < t1; t += kQueryTile) {
      for (int64_t h = 0; h < a.kv_heads; ++h) items.push_back({s, t, std::min(t + kQueryTile, t1), h});
    }
  }
  const int64_t tasks = std::max<int64_t>(1, pool.num_threads());
  tj::ParallelFor(pool, static_cast<int64_t>(items.size()), tasks, [&a, &items](int64_t i) {
    thread_local std::vector<float> scratch;
    thread_local std::vector<const float*> keys;
    Attend(a, items[i], scratch, keys);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(tj_paged_attention_f32, PagedAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("window")
                                  .Attr<float>("soft_cap"));
