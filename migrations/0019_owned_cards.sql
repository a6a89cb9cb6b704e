-- Owned cards priced from what they cost (TCO). A contract may be given as purchase price,
-- salvage value, life, in-service date, power per GPU, electricity price, PUE and other
-- monthly cost instead of a price; its price per GPU-hour is derived from them and stored.
--
-- The depreciation part of that price ends with the card's life. A contract whose card's
-- life ends inside its validity is stored as two rows: the contract itself, valid until the
-- depreciation ends, and its second phase (`phase_of` = the contract), valid from then on at
-- the lower price, with the same model, mode, scope, currency and commitment. Everything that
-- reads contracts to price GPU time sees two adjacent contracts; the API shows one, valid
-- over both.
--
-- Every row also carries what measured energy is charged at (`energy_price_per_kwh` = PUE ×
-- electricity price) and the power part of its price that measured energy replaces
-- (`power_price_per_gpu_hour`); both are 0 on contracts with a plain price. `pue` is 1 there.

ALTER TABLE contracts
    ADD COLUMN phase_of uuid REFERENCES contracts (id) ON DELETE CASCADE,
    ADD COLUMN tco_purchase_price_per_gpu numeric CHECK (tco_purchase_price_per_gpu > 0),
    ADD COLUMN tco_salvage_value_per_gpu numeric CHECK (tco_salvage_value_per_gpu >= 0),
    ADD COLUMN tco_life_months integer CHECK (tco_life_months BETWEEN 1 AND 1200),
    ADD COLUMN tco_in_service_from timestamptz,
    ADD COLUMN tco_power_kw_per_gpu numeric CHECK (tco_power_kw_per_gpu >= 0),
    ADD COLUMN tco_electricity_price_per_kwh numeric CHECK (tco_electricity_price_per_kwh >= 0),
    ADD COLUMN tco_other_per_gpu_month numeric CHECK (tco_other_per_gpu_month >= 0),
    ADD COLUMN pue numeric NOT NULL DEFAULT 1 CHECK (pue >= 1),
    ADD COLUMN power_price_per_gpu_hour numeric NOT NULL DEFAULT 0
        CHECK (power_price_per_gpu_hour >= 0),
    ADD COLUMN energy_price_per_kwh numeric NOT NULL DEFAULT 0 CHECK (energy_price_per_kwh >= 0),
    ADD CONSTRAINT contracts_tco_whole CHECK (
        (tco_purchase_price_per_gpu IS NULL) = (tco_life_months IS NULL)
        AND (tco_life_months IS NULL) = (tco_in_service_from IS NULL)
        AND (tco_life_months IS NULL) = (tco_salvage_value_per_gpu IS NULL)
        AND (tco_life_months IS NULL) = (tco_power_kw_per_gpu IS NULL)
        AND (tco_life_months IS NULL) = (tco_electricity_price_per_kwh IS NULL)
        AND (tco_life_months IS NULL) = (tco_other_per_gpu_month IS NULL)
        AND tco_salvage_value_per_gpu <= tco_purchase_price_per_gpu),
    ADD CONSTRAINT contracts_phase_has_no_tco CHECK (phase_of IS NULL OR tco_life_months IS NULL);

-- A TCO contract's price may be 0 (a fully depreciated card with no other cost); a contract
-- given a price still needs one above 0.
ALTER TABLE contracts DROP CONSTRAINT contracts_price_per_gpu_hour_check;
ALTER TABLE contracts ADD CONSTRAINT contracts_price_per_gpu_hour_check CHECK (
    price_per_gpu_hour > 0
    OR (price_per_gpu_hour = 0 AND (tco_life_months IS NOT NULL OR phase_of IS NOT NULL)));

CREATE UNIQUE INDEX contracts_one_phase ON contracts (phase_of) WHERE phase_of IS NOT NULL;
