// keel's fused CPU kernels against the ATen composites they replace, forward + backward, at the
// shapes of the bench configs' MLPs. The two variants alternate within one process (A B A B ...)
// and each reports its median, so the shared machine's drift hits both alike.
//
//   keel_bench_kernels [--threads 2] [--reps 30]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/host_allocator.h"
#include "model/fused_ops.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t rows, f;  // rows = micro-batch x sequence; the MLP hidden size F
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One forward and backward of op on a fresh leaf, in milliseconds.
double time_once(torch::Tensor (*op)(const torch::Tensor&), const torch::Tensor& input,
                 const torch::Tensor& grad_out) {
  auto x = input.detach().requires_grad_(true);
  const auto t0 = Clock::now();
  auto y = op(x);
  y.backward(grad_out);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else { std::fprintf(stderr, "unknown flag %s\n", flag.c_str()); return 2; }
  }
  at::set_num_threads(threads);
  keel::install_caching_host_allocator(keel::default_host_cache_limit());  // as keel train does
  const Shape shapes[] = {{"small (B16 T128, F384)", 16 * 128, 384},
                          {"medium (B8 T256, F896)", 8 * 256, 896},
                          {"gpt2s (B4 T128, F2048)", 4 * 128, 2048}};
  std::printf("| SwiGLU forward+backward | fused ms | composite ms | speed-up |\n|---|---|---|---|\n");
  for (const auto& s : shapes) {
    const auto input = torch::randn({s.rows, 2 * s.f});
    const auto grad_out = torch::randn({s.rows, s.f});
    if (!keel::model::swiglu_is_fused(input)) {
      std::printf("no AVX2+FMA here: swiglu is the composite\n");
      return 1;
    }
    std::vector<double> fused, composite;
    for (int r = 0; r < reps + 3; ++r) {
      const double a = time_once(&keel::model::swiglu, input, grad_out);
      const double b = time_once(&keel::model::swiglu_composite, input, grad_out);
      if (r >= 3) fused.push_back(a), composite.push_back(b);  // 3 warm-up rounds
    }
    const double f = median(fused), c = median(composite);
    std::printf("| %s | %.3f | %.3f | %.2fx |\n", s.name, f, c, c / f);
  }
  return 0;
}
