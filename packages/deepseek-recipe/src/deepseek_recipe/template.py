"""`python -m deepseek_recipe.template`: a Jinja2 chat template (not implemented yet).

A template cannot express the special-token spans this package tracks (user
text that looks like a control token must stay plain text), so it would only
ever approximate `render_conversation`; it has not been written.
"""

from __future__ import annotations


def main() -> None:
    raise NotImplementedError(
        "the Jinja2 chat template is not implemented; use DeepseekV4Encoding/DeepseekV41Encoding"
    )


if __name__ == "__main__":
    main()
