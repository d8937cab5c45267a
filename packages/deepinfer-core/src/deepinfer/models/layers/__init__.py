"""DeepSeek-V4 building blocks; parameter names follow the official checkpoint keys."""
