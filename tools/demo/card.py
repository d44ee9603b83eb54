#!/usr/bin/env python3
"""card.py DEMO_DIR [HEARTH]: the demo model's card (demo/README.md) from the files finish.sh
laid out: report.json (train.py's), stats.json (corpus.py's), ids.json (ids.py's), ppl.md (the
perplexity table), and hearth's greedy answers to train.py's prompts on the q8_0 file (HEARTH,
default build/hearth). Prints Markdown on stdout."""
import json, math, os, subprocess, sys


def answers(hearth, gguf, report):
    """hearth run's greedy answer to each of train.py's prompts (the ChatML text), 48 tokens"""
    rows = []
    for a in report["answers"]:
        r = subprocess.run([hearth, "run", "-m", gguf, "-p", a["prompt"], "-n", "48", "--temp", "0"],
                           capture_output=True, text=True, check=True)
        q = a["prompt"].split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
        ans = r.stdout.split("<|im_end|>")[0].strip().replace("\n", " ").replace("|", "\\|")
        rows.append(f"| {q} | {ans} |")
    return "\n".join(["| prompt | answer (hearth, q8_0, greedy) |", "| --- | --- |"] + rows)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "demo"
    r = json.load(open(os.path.join(d, "report.json")))
    st = json.load(open(os.path.join(d, "stats.json")))
    ids = json.load(open(os.path.join(d, "ids.json")))
    ppl = open(os.path.join(d, "ppl.md")).read().strip()
    c = r["config"]
    gguf = os.path.join(d, "hearth-demo-q8_0.gguf")
    size = os.path.getsize(gguf) if os.path.exists(gguf) else 0
    ck = os.path.join("build", "demo", "hearth-demo")
    ck_size = sum(os.path.getsize(os.path.join(ck, f)) for f in os.listdir(ck) if f.startswith("model")) if os.path.isdir(ck) else 0
    units = lambda k: st.get(k, {}).get("units", 0)
    chars = lambda k: st.get(k, {}).get("chars", 0)
    pt = r["ppl_torch"]
    ev = r["heldout_evals"]["rows"]
    hearth = sys.argv[2] if len(sys.argv) > 2 else "build/hearth"
    sample = answers(hearth, gguf, r)
    w = pt["window_nll"]
    n_ev = r["heldout_evals"]["windows"]
    best_ev = min(e[2] for e in ev)
    last_train = sum(row[2] for row in r["curve"]["rows"][-50:]) / min(50, len(r["curve"]["rows"]))
    print(f"""# hearth-demo: a small trained qwen35moe model

hearth's demo model: the Qwen3.5/3.6-MoE architecture (GGUF `qwen35moe`) at a toy size,
trained from a random start so that the README's first command shows every part of hearth
working end to end in words. **It is a small demo model**: {r['parameters'] / 1e6:.1f}M parameters
trained for {r['train_seconds'] / 60:.1f} minutes on old public-domain books. It answers in English words,
quotes the King James Bible, explains some hacker jargon and tells fortunes, often wrongly; it
knows nothing else.

## Files

| file | what |
| --- | --- |
| `hearth-demo-q8_0.gguf` | the model for hearth and llama.cpp: `hearth convert hearth-demo --quant q8_0` ({size / 1e6:.1f} MB) |
| `checkpoint.sha256` | the checkpoint's files (transformers' save: safetensors, matrices bfloat16, norms, router, conv taps, A_log, dt_bias float32; {ck_size / 1e6:.1f} MB, kept out of the repo for its size), by SHA-256; `tools/demo/train.py` makes one, `tools/demo/finish.sh` converts it |
| `report.json`, `train.log`, `loss.png` | the training run: settings, versions, the loss curve, PyTorch's perplexity and its greedy answers |
| `heldout.txt` | the held-out text the perplexities are measured on |

## Model

Structure as Qwen3.5/3.6-MoE: {c['num_hidden_layers']} layers, Gated DeltaNet in three of each four and gated
attention in the fourth ({c['num_attention_heads']} query heads, {c['num_key_value_heads']} KV heads of {c['head_dim']}); GDN with {c['linear_num_key_heads']} key
and {c['linear_num_value_heads']} value heads of {c['linear_key_head_dim']}; {c['num_experts']} routed experts (top {c['num_experts_per_tok']}) of width {c['moe_intermediate_size']} and the shared
expert ({c['shared_expert_intermediate_size']}); hidden {c['hidden_size']}; vocabulary {c['vocab_size']}; context trained at {r['ctx']} tokens.
Parameters: {r['parameters']:,} ({r['routed_expert_parameters']:,} in routed experts).

Tokenizer: byte-level BPE of {ids['vocab']} tokens trained on the training text by
`tools/demo/bpe.py` (Qwen2's split pattern; `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`,
`<think>`, `</think>`), and a Qwen-style ChatML template (`tools/demo/template.jinja`; the model
was trained with thinking off: each assistant turn opens with an empty think block).

## Data and licence

Built by `tools/demo/corpus.py` from Debian 12 packages; one unit in 50 (a chapter, a fortune, an
entry) held out by a hash of its name:

| source | Debian package | licence | units (train / held out) | characters (train) |
| --- | --- | --- | ---: | ---: |
| the King James Bible | bible-kjv-text | public domain | {units('kjv/train')} / {units('kjv/heldout')} | {chars('kjv/train'):,} |
| fortune cookies | fortunes, fortunes-min | BSD (the Regents of the University of California; notice in `COPYRIGHT-fortunes`) | {units('fortune/train')} / {units('fortune/heldout')} | {chars('fortune/train'):,} |
| the Jargon File 4.4.7 | jargon-text | public domain | {units('jargon/train')} / {units('jargon/heldout')} | {chars('jargon/train'):,} |
| chat exchanges made by rule from the above | - | as their source | {units('chat/train')} / {units('chat/heldout')} | {chars('chat/train'):,} |

Training tokens: {ids['train_tokens']:,} (chats written {ids['chat_repeat']} times); held-out tokens: {ids['heldout_tokens']:,}.
The model and its files are released under the same terms as hearth.

## Training

`tools/demo/train.py` on {r['device']} with PyTorch {r['versions']['torch']} and transformers
{r['versions']['transformers']} (`Qwen3_5MoeForCausalLM` from a random start): AdamW (lr {r['lr']}, warm-up then cosine
decay over the time budget), batches of {r['batch']} x {r['ctx']} tokens, bf16 autocast, the router's
load-balancing loss on; {r['steps']} steps, {r['tokens_seen']:,} tokens in {r['train_seconds']:.0f} s. The checkpoint
kept is the best by held-out loss (step {r['best_step']}; evaluated every 100 steps on 24 windows).

![loss curve](loss.png)

The held-out loss flattens after about four minutes while the training loss goes on falling
(the last 50 batches average {last_train:.2f} nats, the best held-out evaluation {best_ev:.2f}): the
model has begun to memorise its {ids['train_tokens'] / 1e6:.2f}M tokens, which it saw
{r['tokens_seen'] / ids['train_tokens']:.1f} times. The evaluations during training read the held-out text's first {n_ev}
windows, which are easier than the whole: PyTorch's final figure on those {n_ev} is
{math.exp(sum(w[:n_ev]) / n_ev):.2f}, on all {len(w)} it is {pt['ppl']:.2f}.

## What it says

Greedy answers from `hearth run` on `hearth-demo-q8_0.gguf`, one question each with the chat
template (thinking off); wrong facts and all:

{sample}

## Held-out perplexity

On `heldout.txt`, windows of 512 tokens, the second half of each scored (llama-perplexity's
method); PyTorch: the checkpoint's weights in float32 on the GPU, TF32 off
({pt['ppl']:.4f} +/- {pt['error']:.4f} over {pt['windows']} windows); hearth and llama.cpp on the CPU
(`tests/cli/demo_check.py --checkpoint`; CI runs it on the shipped q8_0 file, the row it can
remake without the checkpoint):

{ppl}
""")


if __name__ == "__main__":
    main()
