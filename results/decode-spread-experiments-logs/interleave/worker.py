import os, sys, time, json
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
d, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from b70bench.decode.child import bench_prompts
llm = LLM(model=sys.argv[4], skip_tokenizer_init=True, seed=0, enable_prefix_caching=False, max_model_len=2048,
          dtype="bfloat16", gpu_memory_utilization=0.15)
prompts = [TokensPrompt(prompt_token_ids=p) for p in bench_prompts(512, 1, 12288)]
sp = SamplingParams(temperature=0.0, max_tokens=512, ignore_eos=True, detokenize=False)
llm.generate(prompts, sp, use_tqdm=False)
open(f"{d}/ready-{me}", "w").close()
lat = []
for i in range(n):
    while not os.path.exists(f"{d}/go-{me}-{i}"):
        time.sleep(0.005)
    t0 = time.perf_counter(); llm.generate(prompts, sp, use_tqdm=False); lat.append(time.perf_counter() - t0)
    open(f"{d}/done-{me}-{i}", "w").close()
json.dump(lat, open(f"{d}/lat-{me}.json", "w"))
