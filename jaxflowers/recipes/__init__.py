"""The registry: every name that stands for a data set, a network or a way to train.

The CLI, the sweep, the bench and the notebooks look names up here and nowhere else; a new data
set, model or recipe is one entry here. Importing it imports no JAX.
"""
from jaxflowers.recipes.datasets import (
                                         DATASETS,
                                         DataUnavailableError,
                                         data_plan,
                                         describe_plan,
                                         is_plan,
                                         load_data,
                                         load_plan,
                                         prepare_plan,
                                         share_plan,
)
from jaxflowers.recipes.examples import (
                                         EXAMPLE_AUGMENTATION,
                                         RECIPES,
                                         Recipe,
                                         augmentation,
                                         digits_options,
                                         flowers_options,
                                         flowers_pretrained_options,
                                         flowers_tuned_options,
                                         recipe,
                                         recipe_for,
                                         sweep_options,
)
from jaxflowers.recipes.networks import (
                                         IMAGE_SIZE,
                                         MODEL_ARGUMENTS,
                                         MODELS,
                                         build_model,
                                         model_spec,
)

__all__ = ["DATASETS", "DataUnavailableError", "EXAMPLE_AUGMENTATION", "IMAGE_SIZE",
           "MODEL_ARGUMENTS", "MODELS",
           "RECIPES", "Recipe", "augmentation", "build_model", "data_plan", "describe_plan",
           "digits_options", "flowers_options", "flowers_pretrained_options",
           "flowers_tuned_options", "is_plan",
           "load_data", "load_plan", "model_spec", "prepare_plan", "recipe", "recipe_for",
           "share_plan", "sweep_options"]
