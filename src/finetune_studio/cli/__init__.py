"""The `finetune-studio` command."""
