"""The one file store (docs/API.md, Files): files uploaded through `/v1/files`
(OpenAI's fine-tuning files, purpose `fine-tune`) and the page's uploads (purpose
`studio`), kept under `<data-dir>/files/` and listed in the `files` table.

    store.py       FileStore: add (check, then rename into place), get, list, delete
    checks.py      what a file of each purpose must be: OpenAI's chat or preference
                   JSONL for `fine-tune`, any shape the studio reads for `studio`
    preference.py  OpenAI's preference rows as the DPO trainer's prompt/chosen/rejected

Plain Python: the server imports it (no FastAPI, no torch); checks run in a thread.
"""
