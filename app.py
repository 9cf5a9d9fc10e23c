"""xPress app: chat with a target LM while a diffusion drafter speculates, and watch what every round did.

The entry point (Hugging Face Spaces runs ``python app.py``); the app itself is the ``xpress_app`` package.
``python app.py --help`` lists the options; each has an environment variable (``xpress_app.config.ENV``).
"""

from xpress_app import zerogpu  # noqa: F401  (first: ZeroGPU's `spaces` must be imported before torch)
from xpress_app.main import main

if __name__ == "__main__":
    main()
