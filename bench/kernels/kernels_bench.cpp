// keel's fused CPU kernels against the ATen composites they replace, forward + backward, at the
// shapes of the bench configs (bench/run.py). The two variants alternate within one process
// (A B A B ...) and each reports its median, so the shared machine's drift hits both alike.
//
//   keel_bench_kernels [--threads 2] [--reps 30]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/host_allocator.h"
#include "model/fused_ops.h"

namespace {

using Clock = std::chrono::steady_clock;
using torch::Tensor;
using Op = std::function<std::vector<Tensor>(const Tensor&)>;

struct Shape {
  const char* name;
  int64_t batch, seq, d_model, heads, d_ff;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One forward and backward of op on a fresh leaf, in milliseconds.
double time_once(const Op& op, const Tensor& input, const std::vector<Tensor>& grads) {
  auto x = input.detach().requires_grad_(true);
  const auto t0 = Clock::now();
  auto outputs = op(x);
  torch::autograd::backward(outputs, grads);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Prints one table row: the medians of fused and composite, alternating, after 3 warm-up rounds.
void compare(const char* name, const Op& fused, const Op& composite, const Tensor& input,
             const std::vector<Tensor>& grads, int reps) {
  std::vector<double> a, b;
  for (int r = 0; r < reps + 3; ++r) {
    const double ta = time_once(fused, input, grads);
    const double tb = time_once(composite, input, grads);
    if (r >= 3) a.push_back(ta), b.push_back(tb);
  }
  const double f = median(a), c = median(b);
  std::printf("| %s | %.3f | %.3f | %.2fx |\n", name, f, c, c / f);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (flag == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  at::set_num_threads(threads);
  keel::model::set_cpu_matmul(keel::model::CpuMatmul::kOneDnn);
  keel::install_caching_host_allocator(keel::default_host_cache_limit());  // as keel train does
  namespace m = keel::model;
  const Shape shapes[] = {{"small", 16, 128, 128, 4, 384},
                          {"medium", 8, 256, 320, 5, 896},
                          {"gpt2s", 4, 128, 768, 12, 2048}};
  if (!m::swiglu_is_fused(torch::randn({2}))) {
    std::printf("no AVX2+FMA here: every op is its composite\n");
    return 1;
  }
  std::printf("| op (forward+backward), config | keel ms | composite ms | speed-up |\n");
  std::printf("|---|---|---|---|\n");
  for (const auto& s : shapes) {
    const int64_t rows = s.batch * s.seq, D = s.d_model / s.heads;
    const auto gate_up = torch::randn({rows, 2 * s.d_ff});
    compare((std::string("SwiGLU, ") + s.name).c_str(),
            [](const Tensor& x) { return std::vector<Tensor>{m::swiglu(x)}; },
            [](const Tensor& x) { return std::vector<Tensor>{m::swiglu_composite(x)}; }, gate_up,
            {torch::randn({rows, s.d_ff})}, reps);

    const auto gain = torch::ones({s.d_model}).requires_grad_(true);
    compare(
        (std::string("RMSNorm, ") + s.name).c_str(),
        [&](const Tensor& x) { return std::vector<Tensor>{m::rms_norm(x, gain, 1e-5)}; },
        [&](const Tensor& x) { return std::vector<Tensor>{m::rms_norm_composite(x, gain, 1e-5)}; },
        torch::randn({s.batch, s.seq, s.d_model}), {torch::randn({s.batch, s.seq, s.d_model})},
        reps);

    const auto angles = torch::rand({s.seq, D / 2});
    const auto cos = angles.cos(), sin = angles.sin();
    const int64_t H = s.heads;
    const auto heads_grad = [&] { return torch::randn({s.batch, H, s.seq, D}); };
    compare((std::string("QKV split + rotary, ") + s.name).c_str(),
            [&](const Tensor& x) {
              auto h = m::split_qkv_rope(x, cos, sin, H, H);
              return std::vector<Tensor>{h.q, h.k, h.v};
            },
            [&](const Tensor& x) {
              auto h = m::split_qkv_rope_composite(x, cos, sin, H, H);
              return std::vector<Tensor>{h.q, h.k, h.v};
            },
            torch::randn({s.batch, s.seq, 3 * s.d_model}),
            {heads_grad(), heads_grad(), heads_grad()}, reps);

    // The MLP's input projection, C -> 2F: oneDNN (run.cpu_matmul: onednn) against at::linear.
    if (m::onednn_linear_available()) {
      const auto fc = torch::randn({2 * s.d_ff, s.d_model}).requires_grad_(true);
      compare((std::string("linear C->2F (oneDNN vs ATen), ") + s.name).c_str(),
              [&](const Tensor& x) { return std::vector<Tensor>{m::linear(x, fc)}; },
              [&](const Tensor& x) { return std::vector<Tensor>{at::linear(x, fc)}; },
              torch::randn({s.batch, s.seq, s.d_model}),
              {torch::randn({s.batch, s.seq, 2 * s.d_ff})}, reps);
    }

    // Heads as split_qkv_rope makes them; the output gradient strided, as attention's gets it.
    const auto heads = torch::randn({3, s.batch, H, s.seq, D});
    compare((std::string("causal attention, ") + s.name).c_str(),
            [](const Tensor& x) {
              return std::vector<Tensor>{m::causal_attention(x[0], x[1], x[2], 0.0)};
            },
            [](const Tensor& x) {
              return std::vector<Tensor>{
                  at::scaled_dot_product_attention(x[0], x[1], x[2], {}, 0.0, true)};
            },
            heads, {torch::randn({s.batch, s.seq, H, D}).transpose(1, 2)}, reps);
  }
  return 0;
}
