// The LSTM recurrence for CPUs, fused: zoo.nn.cpu_lstm compiles this file with the machine's
// C++ compiler and calls it from jitted JAX code through XLA's FFI (RNN backend="cpu_fused").
//
// Why a kernel of our own: XLA:CPU runs an LSTM step as several thunks (the (B, H) @ (H, 4H)
// dot, then the gate fusions), and at B 16, H 256 its two-thread dot waits ~20-50 us per step
// for the second thread to wake, which made the scan 1.9x slower than torch.nn.LSTM (oneDNN) on
// two cores. Here a step's work is split into items of 16 hidden units (a block): an item
// computes its units' four gate columns of the step's matmul and their gate maths in registers.
// The calling thread and helpers on XLA's own intra-op thread pool claim a step's blocks, in
// chunks, from one counter and wait, spinning, only for the previous step's chunks; no thread
// of our own competes with XLA's for the cores, and the caller finishes alone if no helper
// gets a core.
// The large matmuls (the input projection x W for all steps, and the weight gradients X^T dZ,
// H^T dZ, dZ W^T) stay in XLA, where they are already fast.
//
// Layouts (float32, row-major, batch-major as the model's activations, so XLA's matmuls around
// the kernel need no transposes): gates in the order i, f, g, o, as zoo's LSTMCell.
//   forward   xp (B, T, 4, H) = x W;  bias (4, H);  u (H, 4, H) recurrent kernel;  c0, h0 (B, H);
//             valid (B, T) uint8 (0: a padded step, the carry is kept);  reverse: read t from
//             T-1 down to 0.  Results: acts (B, T, 4, H) = (sigma i, sigma f, tanh g, sigma o),
//             c (B, T, H) and h (B, T, H), the carry after each step.
//   backward  d_h_seq (B, T, H) the cotangent of the outputs (h where valid, 0 where padded),
//             d_c, d_h (B, H) of the final carry, acts, c, c0, u, valid, reverse.  Results:
//             dz (B, T, 4, H) the cotangent of the gate pre-activations (x W + bias + h U), and
//             d_c0, d_h0 (B, H).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 16;  // hidden units per block: one 512-bit vector of float32
constexpr int kRows = 6;    // batch rows per register tile (6 rows x 4 vectors = 24 accumulators)
constexpr int64_t kSlice = 128;  // panel rows (k) per pass over the row tiles: 32 KB, in L1
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(Vec));
  return v;
}
inline void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof(Vec)); }

typedef int32_t IVec __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Vec Splat(float x) { return Vec{} + x; }

// The first n lanes of p (n <= 16), zero after: the last block when H is not a multiple of 16.
inline Vec LoadN(const float* p, int n) {
  if (n == kLanes) return Load(p);
  float t[kLanes] = {};
  for (int i = 0; i < n; ++i) t[i] = p[i];
  return Load(t);
}
inline void StoreN(float* p, Vec v, int n) {
  if (n == kLanes) return Store(p, v);
  float t[kLanes];
  Store(t, v);
  for (int i = 0; i < n; ++i) p[i] = t[i];
}

// exp of 16 lanes (Cephes expf: 2^n e^r, |r| <= ln 2 / 2, relative error ~2e-7, inputs clamped
// to [-87, 88]), in vector operations only, so it compiles to a few dozen instructions.
inline Vec Exp(Vec x) {
  x = x < Splat(-87.0f) ? Splat(-87.0f) : x;
  x = x > Splat(88.0f) ? Splat(88.0f) : x;
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no fast-math: kept as written).
  const Vec n = (x * Splat(1.44269504088896341f) + Splat(12582912.0f)) - Splat(12582912.0f);
  const Vec r = x - n * Splat(0.693359375f) + n * Splat(2.12194440e-4f);
  Vec p = Splat(1.9875691500e-4f);
  p = p * r + Splat(1.3981999507e-3f);
  p = p * r + Splat(8.3334519073e-3f);
  p = p * r + Splat(4.1665795894e-2f);
  p = p * r + Splat(1.6666665459e-1f);
  p = p * r + Splat(5.0000001201e-1f);
  p = p * r * r + r + Splat(1.0f);
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  return p * reinterpret_cast<const Vec&>(bits);
}
inline Vec Sigmoid(Vec x) { return Splat(1.0f) / (Splat(1.0f) + Exp(-x)); }
// tanh(x) = 2 sigmoid(2x) - 1: absolute error ~1e-7, as the scan backend's gates.
inline Vec Tanh(Vec x) { return Splat(2.0f) * Sigmoid(Splat(2.0f) * x) - Splat(1.0f); }

// Work split into phases of `per_phase` items (a step's blocks, or for the backward pass a
// step's gate cotangents, then its matmul); every item of a phase needs every item of the
// phases before it. A phase's items are cut into one contiguous chunk per thread, and chunks
// are claimed in order from one counter by the calling thread and by helpers scheduled on
// XLA's intra-op pool; a claimer waits, spinning, only until the earlier phases' chunks are
// done, and those were claimed by threads that are running. The caller waits for its last
// chunk, never for a helper to start: a helper that starts late finds nothing left and
// returns (it holds the counters through a shared_ptr), so a pool busy elsewhere (other
// devices' kernels) slows the call but never blocks it. Results do not depend on who computes
// what: every item runs the same instructions on the same data.
struct Claims {
  alignas(64) std::atomic<int64_t> next{0};  // own cache lines: claimed and finished chunks
  alignas(64) std::atomic<int64_t> done{0};
};

inline void Relax(int spins) {
  if (spins > 4000) {
    std::this_thread::yield();
  } else {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

// Runs a task on another thread: XLA's intra-op pool (FfiSchedule) in the FFI handlers.
using Schedule = std::function<void(std::function<void()>)>;

template <typename Item>
void RunPhases(const Schedule& schedule, int threads, int64_t phases, int64_t per_phase,
               const Item& item) {
  const int64_t chunks = std::min<int64_t>(threads, per_phase), total = phases * chunks;
  auto claims = std::make_shared<Claims>();
  auto work = [claims, total, chunks, per_phase, item = &item]() {
    for (;;) {
      const int64_t k = claims->next.fetch_add(1, std::memory_order_relaxed);
      if (k >= total) return;
      const int64_t phase = k / chunks, chunk = k % chunks, ready = phase * chunks;
      for (int spins = 0; claims->done.load(std::memory_order_acquire) < ready; ++spins)
        Relax(spins);
      for (int64_t i = chunk * per_phase / chunks; i < (chunk + 1) * per_phase / chunks; ++i)
        (*item)(phase, i);
      claims->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 1; i < chunks; ++i) schedule(work);
  work();
  for (int spins = 0; claims->done.load(std::memory_order_acquire) < total; ++spins)
    Relax(spins);
}

// tile(std::integral_constant<int, rows>{}) for 1 <= rows <= kRows: the register tiles are
// templates on their row count, so each count compiles to fully unrolled code.
template <typename Tile>
void ForRows(int rows, const Tile& tile) {
  switch (rows) {
    case 6: return tile(std::integral_constant<int, 6>{});
    case 5: return tile(std::integral_constant<int, 5>{});
    case 4: return tile(std::integral_constant<int, 4>{});
    case 3: return tile(std::integral_constant<int, 3>{});
    case 2: return tile(std::integral_constant<int, 2>{});
    default: return tile(std::integral_constant<int, 1>{});
  }
}

struct Shape {
  int64_t steps, batch, hidden;
  int64_t padded() const { return (hidden + kLanes - 1) / kLanes * kLanes; }
  int64_t blocks() const { return padded() / kLanes; }
};

// Threads for one call (the caller and its helpers): `requested` if > 0 (ZOO_LSTM_THREADS),
// else every thread of XLA's pool, but no more than one per 1 MFLOP of a step's matmul (below
// that the hand-over costs more than the split saves; measured on 2 cores: B 4, H 256 is faster
// on two threads, B 4, H 128 and B 16, H 64 on one) nor one per 16-unit block.
int ThreadsFor(int64_t requested, int64_t pool_threads, const Shape& s) {
  int64_t n = requested;
  if (n <= 0) {
    const int64_t step_flops = 2 * s.batch * s.padded() * 4 * s.padded();
    n = std::min<int64_t>(std::max<int64_t>(1, pool_threads),
                          std::max<int64_t>(1, step_flops / 1000000));
  }
  return static_cast<int>(std::max<int64_t>(1, std::min(n, s.blocks())));
}

int64_t StepAt(int64_t i, int64_t steps, bool reverse) { return reverse ? steps - 1 - i : i; }

// ---- forward ----------------------------------------------------------------------------

// u (H, 4, H) as one panel per block of 16 units: panel[b][k][gate][lane] = u[k, gate, 16b + lane],
// zero past H, so a tile streams one contiguous panel.
std::vector<float> PackForward(const float* u, const Shape& s) {
  const int64_t hp = s.padded(), h = s.hidden;
  std::vector<float> packed(s.blocks() * hp * 4 * kLanes, 0.0f);
  for (int64_t b = 0; b < s.blocks(); ++b)
    for (int64_t k = 0; k < h; ++k)
      for (int g = 0; g < 4; ++g)
        for (int l = 0; l < kLanes && b * kLanes + l < h; ++l)
          packed[((b * hp + k) * 4 + g) * kLanes + l] = u[(k * 4 + g) * h + b * kLanes + l];
  return packed;
}

// z[m][gate][lane] (+)= sum_{k in [k0, k1)} h[row0 + m, k] * panel[k][gate][lane], MR rows.
template <int MR>
void ForwardTile(const float* h, int64_t row0, int64_t hp, const float* panel, int64_t k0,
                 int64_t k1, float* z) {
  Vec acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < 4; ++g)
      acc[m][g] = k0 == 0 ? Splat(0.0f) : Load(z + (m * 4 + g) * kLanes);
  for (int64_t k = k0; k < k1; ++k) {
    const float* p = panel + k * 4 * kLanes;
    const Vec b0 = Load(p), b1 = Load(p + kLanes), b2 = Load(p + 2 * kLanes),
              b3 = Load(p + 3 * kLanes);
    for (int m = 0; m < MR; ++m) {
      const float a = h[(row0 + m) * hp + k];
      acc[m][0] += a * b0;
      acc[m][1] += a * b1;
      acc[m][2] += a * b2;
      acc[m][3] += a * b3;
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < 4; ++g) Store(z + (m * 4 + g) * kLanes, acc[m][g]);
}

void Forward(const Shape& s, const float* xp, const float* bias, const float* u, const float* c0,
             const float* h0,
             const uint8_t* valid, bool reverse, const Schedule& schedule, int threads,
             float* acts, float* c_out, float* h_out) {
  const int64_t T = s.steps, B = s.batch, H = s.hidden, hp = s.padded();
  const std::vector<float> panels = PackForward(u, s);
  // h of the previous step, read by every item of a step (double-buffered: step i reads one
  // buffer and writes the other, which no item of step i reads); c, per unit, is read and
  // written by one item per step.
  std::vector<float> hbuf(2 * B * hp, 0.0f), cbuf(B * hp, 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(&hbuf[b * hp], h0 + b * H, H * sizeof(float));
    std::memcpy(&cbuf[b * hp], c0 + b * H, H * sizeof(float));
  }
  // Item (i, blk): step i (reading order) for the 16 units of block blk, every row.
  RunPhases(schedule, threads, T, s.blocks(), [&](int64_t i, int64_t blk) {
    thread_local std::vector<float> z;  // (B, 4, 16): this block's matmul results
    z.resize(B * 4 * kLanes);
    const int64_t t = StepAt(i, T, reverse);
    const float* h_prev = &hbuf[(i % 2) * B * hp];
    float* h_next = &hbuf[((i + 1) % 2) * B * hp];
    const float* panel = &panels[blk * hp * 4 * kLanes];
    const int64_t j0 = blk * kLanes;
    const int lanes = static_cast<int>(std::min<int64_t>(kLanes, H - j0));
    // This step's x W lines for these units (a row's are T * 4H floats apart), requested now so
    // they arrive during the matmul below: read cold after it, the first of them stalled the
    // gate maths (11% of the kernel's samples at B 16, T 128, H 256; the forward 2-5% faster).
    for (int64_t b = 0; b < B; ++b)
      for (int g = 0; g < 4; ++g) __builtin_prefetch(xp + ((b * T + t) * 4 + g) * H + j0);
    // The panel's k range in slices of kSlice rows (32 KB), each slice streamed once from L2
    // into L1 and used by every row tile; the partial sums wait in z.
    for (int64_t k0 = 0; k0 < hp; k0 += kSlice)
      for (int64_t r0 = 0; r0 < B; r0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, B - r0));
        ForRows(rows, [&](auto mr) {
          ForwardTile<decltype(mr)::value>(h_prev, r0, hp, panel, k0, std::min(k0 + kSlice, hp),
                                           &z[r0 * 4 * kLanes]);
        });
      }
    for (int64_t r0 = 0; r0 < B; r0 += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, B - r0));
      for (int m = 0; m < rows; ++m) {
        const int64_t b = r0 + m;
        const bool keep = valid[b * T + t] != 0;
        const float* x = xp + (b * T + t) * 4 * H + j0;
        float* a = acts + (b * T + t) * 4 * H + j0;
        float* c = &cbuf[b * hp + j0];  // padded buffers: always 16 lanes
        float* hn = h_next + b * hp + j0;
        const float* zm = &z[b * 4 * kLanes];
        const float* bj = bias + j0;
        const Vec ig = Sigmoid(Load(zm) + LoadN(x, lanes) + LoadN(bj, lanes));
        const Vec fg = Sigmoid(Load(zm + kLanes) + LoadN(x + H, lanes) + LoadN(bj + H, lanes));
        const Vec gg = Tanh(Load(zm + 2 * kLanes) + LoadN(x + 2 * H, lanes) +
                            LoadN(bj + 2 * H, lanes));
        const Vec og = Sigmoid(Load(zm + 3 * kLanes) + LoadN(x + 3 * H, lanes) +
                               LoadN(bj + 3 * H, lanes));
        StoreN(a, ig, lanes);
        StoreN(a + H, fg, lanes);
        StoreN(a + 2 * H, gg, lanes);
        StoreN(a + 3 * H, og, lanes);
        if (keep) {  // a padded step keeps the carry (h_next gets h_prev)
          const Vec cn = fg * Load(c) + ig * gg;
          Store(c, cn);
          Store(hn, og * Tanh(cn));
        } else {
          Store(hn, Load(h_prev + b * hp + j0));
        }
        // Lanes past H are garbage in c, h_next; zero them so the next matmul reads 0.
        if (lanes < kLanes) {
          StoreN(c, LoadN(c, lanes), kLanes);
          StoreN(hn, LoadN(hn, lanes), kLanes);
        }
        std::memcpy(c_out + (b * T + t) * H + j0, c, lanes * sizeof(float));
        std::memcpy(h_out + (b * T + t) * H + j0, hn, lanes * sizeof(float));
      }
    }
  });
}

// ---- backward ---------------------------------------------------------------------------

// u (H, 4, H) transposed for dh = dz u^T: panel[b][gate * Hp + k][lane] = u[16b + lane, gate, k].
std::vector<float> PackBackward(const float* u, const Shape& s) {
  const int64_t hp = s.padded(), h = s.hidden, kk = 4 * hp;
  std::vector<float> packed(s.blocks() * kk * kLanes, 0.0f);
  for (int64_t b = 0; b < s.blocks(); ++b)
    for (int g = 0; g < 4; ++g)
      for (int64_t k = 0; k < h; ++k)
        for (int l = 0; l < kLanes && b * kLanes + l < h; ++l)
          packed[(b * kk + g * hp + k) * kLanes + l] = u[((b * kLanes + l) * 4 + g) * h + k];
  return packed;
}

// dh[row0 + m][NB blocks from blk0] = sum_k dz[row0 + m, k] * panel_n[k] for MR rows.
template <int MR, int NB>
void BackwardTile(const float* dz, int64_t row0, int64_t kk, const float* panels,
                  int64_t blk0, float* out, int64_t out_stride) {
  Vec acc[MR][NB] = {};
  for (int64_t k = 0; k < kk; ++k) {
    Vec bv[NB];
    for (int n = 0; n < NB; ++n) bv[n] = Load(panels + ((blk0 + n) * kk + k) * kLanes);
    for (int m = 0; m < MR; ++m) {
      const float a = dz[(row0 + m) * kk + k];
      for (int n = 0; n < NB; ++n) acc[m][n] += a * bv[n];
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NB; ++n) Store(out + m * out_stride + (blk0 + n) * kLanes, acc[m][n]);
}

void Backward(const Shape& s, const float* d_h_seq, const float* d_c_last, const float* d_h_last,
              const float* acts, const float* c_seq, const float* c0, const float* u,
              const uint8_t* valid, bool reverse, const Schedule& schedule, int threads,
              float* dz_out, float* d_c0, float* d_h0) {
  const int64_t T = s.steps, B = s.batch, H = s.hidden, hp = s.padded(), kk = 4 * hp;
  const std::vector<float> panels = PackBackward(u, s);
  // dh, dc: the carry's cotangent, per unit. dz: the gate cotangents of a step, padded,
  // double-buffered by step (a phase's matmul reads the previous step's buffer, which every
  // item of the phase reads, while its second half writes the other). gemm: the matmul's rows
  // before the padding rule.
  std::vector<float> dh(B * hp, 0.0f), dc(B * hp, 0.0f), dzbuf(2 * B * kk, 0.0f),
      gemm(B * hp, 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(&dh[b * hp], d_h_last + b * H, H * sizeof(float));
    std::memcpy(&dc[b * hp], d_c_last + b * H, H * sizeof(float));
  }
  // Items are groups of 4 blocks (64 units: the matmul tile's width). Phase q, in reading
  // order backwards: first dh entering step T-q = dz_{T-q} u^T for the group's units (q > 0),
  // then, from that dh, the gate cotangents of step T-1-q for the same units (q < T): one
  // hand-over per step, as in the forward pass.
  const int64_t groups = (s.blocks() + 3) / 4;
  RunPhases(schedule, threads, T + 1, groups, [&](int64_t q, int64_t group) {
    const int64_t first = 4 * group, last = std::min(first + 4, s.blocks());
    if (q > 0) {
      const float* dz = &dzbuf[((q - 1) % 2) * B * kk];
      const int64_t t_done = StepAt(T - q, T, reverse);
      for (int64_t r0 = 0; r0 < B; r0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, B - r0));
        float* out = &gemm[r0 * hp];
        if (last - first == 4) {
          ForRows(rows, [&](auto mr) {
            BackwardTile<decltype(mr)::value, 4>(dz, r0, kk, panels.data(), first, out, hp);
          });
          continue;
        }
        for (int64_t blk = first; blk < last; ++blk)
          ForRows(rows, [&](auto mr) {
            BackwardTile<decltype(mr)::value, 1>(dz, r0, kk, panels.data(), blk, out, hp);
          });
      }
      for (int64_t b = 0; b < B; ++b) {  // a padded row's dh passes through unchanged
        if (valid[b * T + t_done] == 0) continue;
        std::memcpy(&dh[b * hp + first * kLanes], &gemm[b * hp + first * kLanes],
                    (last - first) * kLanes * sizeof(float));
      }
    }
    if (q == T) return;
    const int64_t i = T - 1 - q;
    const int64_t t = StepAt(i, T, reverse);
    const int64_t t_prev = i > 0 ? StepAt(i - 1, T, reverse) : -1;  // the step before t
    float* dz = &dzbuf[(q % 2) * B * kk];
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t j0 = blk * kLanes;
      const int lanes = static_cast<int>(std::min<int64_t>(kLanes, H - j0));
      for (int64_t b = 0; b < B; ++b) {
        const bool keep = valid[b * T + t] != 0;
        float* dzp = dz + b * kk + j0;  // padded: always 16 lanes
        if (!keep) {  // a padded step kept its carry: its cotangent passes through
          for (int g = 0; g < 4; ++g) Store(dzp + g * hp, Splat(0.0f));
          for (int g = 0; g < 4; ++g)
            StoreN(dz_out + ((b * T + t) * 4 + g) * H + j0, Splat(0.0f), lanes);
          continue;
        }
        const float* a = acts + (b * T + t) * 4 * H + j0;
        const float* cp = (t_prev < 0 ? c0 + b * H : c_seq + (b * T + t_prev) * H) + j0;
        const Vec ig = LoadN(a, lanes), fg = LoadN(a + H, lanes), gg = LoadN(a + 2 * H, lanes),
                  og = LoadN(a + 3 * H, lanes);
        const Vec th = Tanh(LoadN(c_seq + (b * T + t) * H + j0, lanes));
        const Vec dhl = Load(&dh[b * hp + j0]) + LoadN(d_h_seq + (b * T + t) * H + j0, lanes);
        const Vec one = Splat(1.0f);
        const Vec dcl = Load(&dc[b * hp + j0]) + dhl * og * (one - th * th);
        const Vec zi = dcl * gg * ig * (one - ig);
        const Vec zf = dcl * LoadN(cp, lanes) * fg * (one - fg);
        const Vec zg = dcl * ig * (one - gg * gg);
        const Vec zo = dhl * th * og * (one - og);
        float* dzo = dz_out + (b * T + t) * 4 * H + j0;
        StoreN(dzo, zi, lanes);
        StoreN(dzo + H, zf, lanes);
        StoreN(dzo + 2 * H, zg, lanes);
        StoreN(dzo + 3 * H, zo, lanes);
        // Lanes past H load as 0 above, so their dz is 0 and the matmul ignores them.
        Store(dzp, zi);
        Store(dzp + hp, zf);
        Store(dzp + 2 * hp, zg);
        Store(dzp + 3 * hp, zo);
        Store(&dc[b * hp + j0], dcl * fg);
      }
    }
  });
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(d_c0 + b * H, &dc[b * hp], H * sizeof(float));
    std::memcpy(d_h0 + b * H, &dh[b * hp], H * sizeof(float));
  }
}

// ---- XLA FFI bindings -------------------------------------------------------------------

Schedule FfiSchedule(ffi::ThreadPool& pool) {
  return [&pool](std::function<void()> task) { pool.Schedule(std::move(task)); };
}

ffi::Error CheckShapes(const Shape& s, ffi::Span<const int64_t> gates4, const char* what) {
  if (gates4.size() != 4 || gates4[0] != s.batch || gates4[1] != s.steps || gates4[2] != 4 ||
      gates4[3] != s.hidden)
    return ffi::Error::InvalidArgument(std::string(what) + " must be (B, T, 4, H)");
  return ffi::Error::Success();
}

ffi::Error ForwardImpl(ffi::Buffer<ffi::F32> xp, ffi::Buffer<ffi::F32> bias,
                       ffi::Buffer<ffi::F32> u,
                       ffi::Buffer<ffi::F32> c0, ffi::Buffer<ffi::F32> h0,
                       ffi::Buffer<ffi::U8> valid, ffi::ResultBuffer<ffi::F32> acts,
                       ffi::ResultBuffer<ffi::F32> c, ffi::ResultBuffer<ffi::F32> h,
                       int64_t reverse, int64_t threads, ffi::ThreadPool pool) {
  const auto dims = xp.dimensions();
  if (dims.size() != 4) return ffi::Error::InvalidArgument("xp must be (B, T, 4, H)");
  const Shape s{dims[1], dims[0], dims[3]};
  if (auto e = CheckShapes(s, dims, "xp"); e.failure()) return e;
  if (s.steps == 0 || s.batch == 0) return ffi::Error::Success();
  Forward(s, xp.typed_data(), bias.typed_data(), u.typed_data(), c0.typed_data(),
          h0.typed_data(),
          valid.typed_data(), reverse != 0, FfiSchedule(pool),
          ThreadsFor(threads, pool.num_threads(), s), acts->typed_data(), c->typed_data(),
          h->typed_data());
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::Buffer<ffi::F32> d_h_seq, ffi::Buffer<ffi::F32> d_c_last,
                        ffi::Buffer<ffi::F32> d_h_last, ffi::Buffer<ffi::F32> acts,
                        ffi::Buffer<ffi::F32> c_seq, ffi::Buffer<ffi::F32> c0,
                        ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::U8> valid,
                        ffi::ResultBuffer<ffi::F32> dz, ffi::ResultBuffer<ffi::F32> d_c0,
                        ffi::ResultBuffer<ffi::F32> d_h0, int64_t reverse, int64_t threads,
                        ffi::ThreadPool pool) {
  const auto dims = acts.dimensions();
  if (dims.size() != 4) return ffi::Error::InvalidArgument("acts must be (B, T, 4, H)");
  const Shape s{dims[1], dims[0], dims[3]};
  if (auto e = CheckShapes(s, dims, "acts"); e.failure()) return e;
  if (s.batch == 0) return ffi::Error::Success();
  if (s.steps == 0) {  // nothing read: the carry's cotangent is the initial carry's
    std::memcpy(d_c0->typed_data(), d_c_last.typed_data(), s.batch * s.hidden * sizeof(float));
    std::memcpy(d_h0->typed_data(), d_h_last.typed_data(), s.batch * s.hidden * sizeof(float));
    return ffi::Error::Success();
  }
  Backward(s, d_h_seq.typed_data(), d_c_last.typed_data(), d_h_last.typed_data(),
           acts.typed_data(), c_seq.typed_data(), c0.typed_data(), u.typed_data(),
           valid.typed_data(), reverse != 0, FfiSchedule(pool),
           ThreadsFor(threads, pool.num_threads(), s), dz->typed_data(), d_c0->typed_data(),
           d_h0->typed_data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZooLstmForward, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // xp
                                  .Arg<ffi::Buffer<ffi::F32>>()   // bias
                                  .Arg<ffi::Buffer<ffi::F32>>()   // u
                                  .Arg<ffi::Buffer<ffi::F32>>()   // c0
                                  .Arg<ffi::Buffer<ffi::F32>>()   // h0
                                  .Arg<ffi::Buffer<ffi::U8>>()    // valid
                                  .Ret<ffi::Buffer<ffi::F32>>()   // acts
                                  .Ret<ffi::Buffer<ffi::F32>>()   // c
                                  .Ret<ffi::Buffer<ffi::F32>>()   // h
                                  .Attr<int64_t>("reverse")
                                  .Attr<int64_t>("threads")
                                  .Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZooLstmBackward, BackwardImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // d_h_seq
                                  .Arg<ffi::Buffer<ffi::F32>>()   // d_c_last
                                  .Arg<ffi::Buffer<ffi::F32>>()   // d_h_last
                                  .Arg<ffi::Buffer<ffi::F32>>()   // acts
                                  .Arg<ffi::Buffer<ffi::F32>>()   // c_seq
                                  .Arg<ffi::Buffer<ffi::F32>>()   // c0
                                  .Arg<ffi::Buffer<ffi::F32>>()   // u
                                  .Arg<ffi::Buffer<ffi::U8>>()    // valid
                                  .Ret<ffi::Buffer<ffi::F32>>()   // dz
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d_c0
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d_h0
                                  .Attr<int64_t>("reverse")
                                  .Attr<int64_t>("threads")
                                  .Ctx<ffi::ThreadPool>());
