// Loads a saved TorchScript model, runs it without and with torch_llga, checks that the outputs
// agree and prints both latencies.
//
//   run_model model.pt 1x3x224x224 [runs]
#include <torch/script.h>
#include <torch_llga.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream ss(text);
  for (std::string dim; std::getline(ss, dim, 'x');) shape.push_back(std::stoll(dim));
  return shape;
}

struct Run {
  at::Tensor output;
  double median_ms;
};

// Loads the model afresh (each module optimizes its own graph), warms up twice (profiling run,
// then optimization), then times `runs` calls.
Run run(const std::string& path, const at::Tensor& input, int runs) {
  torch::jit::Module module = torch::jit::load(path);
  module.eval();
  std::vector<torch::jit::IValue> args{input};
  module.forward(args);
  module.forward(args);
  std::vector<double> ms;
  at::Tensor out;
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    out = module.forward(args).toTensor();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {out, ms[ms.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: run_model model.pt 1x3x224x224 [runs]\n";
    return 2;
  }
  const std::string path = argv[1];
  const int runs = argc > 3 ? std::stoi(argv[3]) : 20;
  torch::manual_seed(0);
  at::Tensor input = torch::rand(parse_shape(argv[2]));
  torch::NoGradGuard no_grad;

  torch_llga::disable();
  Run plain = run(path, input, runs);
  torch_llga::enable();
  Run fused = run(path, input, runs);

  double diff = (fused.output - plain.output).abs().max().item<double>();
  bool agree = torch::allclose(fused.output, plain.output, 1e-4, 1e-4);
  std::cout << "TorchScript " << plain.median_ms << " ms, torch_llga " << fused.median_ms << " ms ("
            << plain.median_ms / fused.median_ms << "x); max abs diff " << diff << ": outputs "
            << (agree ? "agree" : "DIFFER") << "\n";
  return agree ? 0 : 1;
}
