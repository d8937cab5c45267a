"""Request settings that every protocol checks the same way, with the official wording.

Chat Completions, Responses and Anthropic Messages name some settings
differently but validate the model name, the sampling ranges, the output
bound and stop sequences alike; each converter calls these at its own point in
the official order, so a request with several problems reports the same first one.
"""

from __future__ import annotations

from deepseek_recipe.errors import ConversionError
from deepseek_recipe.options import ConversionOptions, ModelVersion

_MAX_STOP_SEQUENCES = 16


def model_version(model: str, options: ConversionOptions) -> ModelVersion:
    """The model version a request's model name (or a configured alias) selects."""
    models = options.model_versions_by_name
    version = models.get(model)
    if version is None:
        names = ", ".join(models)
        raise ConversionError(f"The supported API model names are {names}, but you passed {model}.")
    return version


def range_error(name: str, rng: str) -> ConversionError:
    """The error for a setting outside its range, naming the setting as Chat Completions does."""
    return ConversionError(f"Invalid {name} value, the valid range of {name} is {rng}")


def check_sampling_ranges(temperature: float | None, top_p: float | None) -> None:
    """Temperature in [0, 2] and top-p in (0, 1], checked in that order."""
    if temperature is not None and not 0 <= temperature <= 2:
        raise range_error("temperature", "[0, 2]")
    if top_p is not None and not 0 < top_p <= 1:
        raise range_error("top_p", "(0, 1.0]")


def max_tokens_bound(options: ConversionOptions, thinking: bool) -> int:
    """The largest output length the configuration allows in this thinking mode."""
    if thinking:
        return options.thinking_max_tokens_upper_bound
    return options.non_thinking_max_tokens_upper_bound


def stop_sequences(stop: str | list[str] | None) -> list[str]:
    """The stop sequences as a list: at most 16, none of them empty."""
    if stop is None:
        return []
    if isinstance(stop, str):
        if stop == "":
            raise ConversionError(
                "Invalid 'stop': empty string. Expected a string with minimum length 1, "
                "but got an empty string instead."
            )
        return [stop]
    if len(stop) > _MAX_STOP_SEQUENCES:
        raise ConversionError(f"Stop string array too long: {len(stop)}")
    for i, item in enumerate(stop):
        if item == "":
            raise ConversionError(
                f"Invalid 'stop[{i}]': empty string. Expected a string with minimum length 1, "
                "but got an empty string instead."
            )
    return list(stop)
