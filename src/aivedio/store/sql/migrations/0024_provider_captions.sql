-- Captions a provider's adapter reported with an output (providers/seam.py ProviderCaption:
-- language, label, kind, default and the WebVTT or SRT text, bounded there). Untrusted text:
-- the render cleans each into a WebVTT track of the HLS output (pipeline/media/webvtt.py)
-- or leaves it out. NULL: none reported.
ALTER TABLE provider_outputs ADD COLUMN captions jsonb;
