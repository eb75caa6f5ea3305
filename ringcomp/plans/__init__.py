"""The call path: every all-reduce a plan, resolved once, bound to its executor, agreed per call."""
