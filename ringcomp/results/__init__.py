"""The results wing: records (data plus provenance) and the docs' tables rendered from them."""
