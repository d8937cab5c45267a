"""The offline engine: requests, scheduler, model runner and the step loop."""
