"""Compiling jaxflowers' programs: XLA options and the persistent compilation cache."""
from jaxflowers.compilation.cache import enable_compilation_cache
from jaxflowers.compilation.options import compiler_options

__all__ = ["compiler_options", "enable_compilation_cache"]
