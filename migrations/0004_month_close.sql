-- Closed months. The report of a closed month is frozen as it was at close, byte for byte:
-- later records, corrections and re-rating that touch the month still change the rated data,
-- and their effect is booked into the first open month as prior-period adjustments.
CREATE TABLE month_closes (
    month       date PRIMARY KEY CHECK (extract(day FROM month) = 1),
    closed_at   timestamptz NOT NULL,
    closed_by   uuid,
    report_json text NOT NULL
);
