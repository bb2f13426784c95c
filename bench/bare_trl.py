"""The baseline: the same LoRA run as a plain TRL script, as a user would write it.

    python bench/bare_trl.py MODEL_DIR DATA.jsonl STEPS [--format alpaca|raw]
                             [--batch 2] [--max-length 128] [--packing]

Same model, data, steps, seed, batch, learning rate and LoRA shape as the job that
bench/run.py (or bench/gpu.py) sends to the server; no server, no events, no checks.
On a CUDA machine it trains in bf16 on the GPU, as the server's child does.
"""

from __future__ import annotations

import argparse
import json
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("data_path")
    parser.add_argument("steps", type=int)
    parser.add_argument("--format", choices=["alpaca", "raw"], default="alpaca")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--packing", action="store_true")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = []
    with open(args.data_path) as handle:
        for line in handle:
            row = json.loads(line)
            if args.format == "raw":
                rows.append({"text": row["text"]})
                continue
            prompt = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
            rows.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": row["output"]}]})
    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16 if cuda else torch.float32)
    if cuda:
        model = model.to("cuda")
    with tempfile.TemporaryDirectory() as output:
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(
                output_dir=output, max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=1e-3,
                optim="adamw_torch", seed=3407, data_seed=3407, logging_steps=1, save_strategy="no",
                report_to="none", disable_tqdm=True, use_cpu=not cuda, bf16=cuda, activation_checkpointing=False,
                max_length=args.max_length, packing=args.packing, completion_only_loss=False, weight_decay=0.001,
            ),
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"),
        )
        trainer.train()
        trainer.model.save_pretrained(output + "/adapter")


if __name__ == "__main__":
    main()
