"""What the tests share, by topic; conftest.py files hold fixtures only and import from here.

    paths        REPO, DEMO_DATA
    polling      wait_for: the one way a test waits for a condition
    processes    alive, pid_exists
    jobs         job_request, start_body, dataset, collect, phases, finished_job;
                 ScriptedWorker, InstantHandle, InstantLauncher (workers that are no process)
    servers      ServerProcess (a real `finetune-studio serve`), LiveServer (the app under
                 uvicorn in this process)
    chat         ChatServer and the scripted training jobs the chat tests serve
    exports      trained_job, events_of: exports against a LiveServer
    export_records  export records written straight into a store
    disks        SmallDisk (a tmpfs to fill)
    browser      Playwright's expect and the page helpers; page_studio: the scripted
                 server the page tests drive
    evaluations  the real evaluation child run against fake_openai (an OpenAI-compatible
                 stand-in served in this process)
    recipes, imports, streams, dumps, llama_build, inference_engine, whole_file_json, s3:
                 what more than one test module of that topic uses
    children     the module names of the stand-in children, for `python -m`

The stand-in children, each run as `python -m tests.helpers.<name>`: stand_in_worker
(training), stand_in_export_worker, stand_in_chat_child, stand_in_inspect_child,
hooked_child (the real training child with test hooks), nan_worker; loud_worker is a
launcher that runs no process. This package imports nothing here, so that a child
started from it loads only what its own module needs.
"""
