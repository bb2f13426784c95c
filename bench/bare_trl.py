"""The baseline: the same LoRA run as a plain TRL script, as a user would write it.

    python bench/bare_trl.py MODEL_DIR DATA.jsonl STEPS

Same model, data, steps, seed, batch, learning rate and LoRA shape as the job that
bench/overhead.py sends to the server; no server, no events, no checks.
"""

from __future__ import annotations

import json
import sys
import tempfile


def main() -> None:
    model_dir, data_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = []
    with open(data_path) as handle:
        for line in handle:
            row = json.loads(line)
            prompt = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
            rows.append({"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": row["output"]}]})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with tempfile.TemporaryDirectory() as output:
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(
                output_dir=output, max_steps=steps, per_device_train_batch_size=2, learning_rate=1e-3,
                optim="adamw_torch", seed=3407, data_seed=3407, logging_steps=1, save_strategy="no",
                report_to="none", disable_tqdm=True, use_cpu=True, bf16=False, activation_checkpointing=False,
                max_length=128, completion_only_loss=False, weight_decay=0.001,
            ),
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"),
        )
        trainer.train()
        trainer.model.save_pretrained(output + "/adapter")


if __name__ == "__main__":
    main()
