"""The two grammars as they were before they became one language (``swamp/domain/language.py``),
kept verbatim (but for this import) only so that generated inputs can be compared against them:
every accepted expression evaluates to the same value, every rejection reads the same."""
