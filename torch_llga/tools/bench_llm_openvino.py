"""The LLM benchmark's OpenVINO backend: a saved Hugging Face model exported with optimum-intel's
OVModelForCausalLM (its documented recipe: a stateful model, the KV cache kept inside OpenVINO), then
generate() timed as bench_llm times the others. Run by bench_llm, in this Python when it has
optimum-intel, else as a script in the Python given by --openvino-python (optimum-intel pins an older
transformers than torch_llga's tests use, so it usually lives in a venv of its own):

    python bench_llm_openvino.py MODEL_DIR PROMPT_IDS_JSON NEW_TOKENS ROUNDS THREADS fp32|bf16

prints one JSON line: preparation seconds, first-token ms and decode tokens/s per round, the tokens.
Imports neither torch_llga nor anything of it: it runs where torch_llga is not installed.
"""
import json
import sys
import time


class FirstToken:
    """A generate() streamer noting when the first new token arrives (its first put() is the prompt)."""

    def __init__(self):
        self.puts, self.first = 0, None

    def put(self, _):
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self):
        pass


def run(model_dir, prompt, new_tokens, rounds, threads, dtype):
    import torch

    # optimum-intel imports diffusers wherever it finds it: the main venv's (the bench's UNet) needs a
    # newer huggingface_hub than optimum-intel's pin. An LLM export needs none of it.
    sys.modules.setdefault("diffusers", None)
    from optimum.intel import OVModelForCausalLM

    start = time.perf_counter()
    # f32 or bf16 compute, as asked (OpenVINO would otherwise pick bf16 on CPUs that have it); one
    # stream on `threads` cores; the weights exported as they are (optimum-intel compresses models
    # over 1B parameters to int8 unless told not to).
    config = {"INFERENCE_PRECISION_HINT": "f32" if dtype == "fp32" else "bf16", "NUM_STREAMS": "1",
              "INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY"}
    model = OVModelForCausalLM.from_pretrained(model_dir, export=True, load_in_8bit=False, ov_config=config)
    ids = torch.tensor([prompt])

    def generate():
        streamer = FirstToken()
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, streamer=streamer)
        end = time.perf_counter()
        return out, (streamer.first - t) * 1e3, (new_tokens - 1) / (end - streamer.first)

    for _ in range(3):  # as bench_llm's PREPARATION_CALLS
        generate()
    prepared = time.perf_counter() - start
    runs = [generate() for _ in range(rounds)]
    return {"prepared": prepared, "first_ms": [r[1] for r in runs], "per_second": [r[2] for r in runs],
            "tokens": runs[-1][0].tolist()}


if __name__ == "__main__":
    model_dir, prompt, new_tokens, rounds, threads, dtype = sys.argv[1:7]
    import warnings

    warnings.filterwarnings("ignore")
    result = run(model_dir, json.loads(prompt), int(new_tokens), int(rounds), int(threads), dtype)
    print(json.dumps(result))
