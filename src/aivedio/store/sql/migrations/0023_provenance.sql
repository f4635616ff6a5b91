-- provenance: what the source's C2PA manifest store says (aivedio/provenance/summary.py),
-- read at the probe in a sandboxed child: present or not, its validation state (absent,
-- trusted, valid, untrusted, invalid) with failure codes, claim generator, signer, digital
-- source type, actions and the store's own SHA-256. NULL: never read (an asset probed
-- before this column, or with reading off). The state is its own column so that an
-- operator can count what came in unsigned or tampered without reading JSON.
ALTER TABLE assets ADD COLUMN provenance jsonb;
ALTER TABLE assets ADD COLUMN provenance_state text
    CONSTRAINT assets_provenance_state CHECK (
        provenance_state IN ('absent', 'trusted', 'valid', 'untrusted', 'invalid'));
