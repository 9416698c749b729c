"""python -m torch_llga.bench: the benchmark (torch_llga.tools.bench) by its short name."""
from torch_llga.tools.bench import main

if __name__ == "__main__":
    main(prog="python -m torch_llga.bench")
