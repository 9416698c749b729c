"""torch_llga's tools, shipped in the wheel beside the library but no part of it: the benchmark
(python -m torch_llga.tools.bench), the LLM benchmark (.bench_llm), the model sweep (.check_models),
a model's time layer by layer (.layer_times), the suite runner over PyTorch's CPU model lists
(.suite), the demo (.demo) and the generated part of docs/ops.md (.ops_doc). The library never imports them."""
