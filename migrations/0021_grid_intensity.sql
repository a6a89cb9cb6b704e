-- Carbon intensity of the electricity grid per region and ledger month, entered like FX
-- rates: gCO2e per kWh. Emissions are read from it with every figure (energy × PUE ×
-- intensity), so a change is seen by the next read and nothing is re-rated.
CREATE TABLE grid_intensity (
    month          date NOT NULL CHECK (extract(day FROM month) = 1),
    region         text NOT NULL CHECK (region <> ''),
    g_co2e_per_kwh numeric NOT NULL CHECK (g_co2e_per_kwh >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (month, region)
);
