//! Slurm's host lists: `gpu[01-04,07],login1` names gpu01, gpu02, gpu03, gpu04, gpu07 and
//! login1. Commas outside brackets separate names; inside brackets they separate numbers and
//! ranges, whose zero padding is kept (`[08-10]` is 08, 09, 10). A name with several bracket
//! groups (`rack[1-2]-n[1-2]`) names every combination, as Slurm's `scontrol show hostnames`
//! lists them. `None assigned` and `(null)` name no node.

/// Expands a host list; `limit` bounds how many names it may name, so that a range such as
/// `n[0-99999999]` is refused rather than built.
pub fn expand(raw: &str, limit: usize) -> Result<Vec<String>, String> {
    let raw = raw.trim();
    if raw.is_empty() || raw == "None assigned" || raw == "(null)" {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    for item in split_top(raw)? {
        let mut expanded = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            let (prefix, group, after) = match rest.find('[') {
                Some(open) => {
                    let close = rest[open..]
                        .find(']')
                        .map(|offset| open + offset)
                        .ok_or_else(|| format!("`{raw}`: a `[` is not closed"))?;
                    (
                        &rest[..open],
                        Some(&rest[open + 1..close]),
                        &rest[close + 1..],
                    )
                }
                None => (rest, None, ""),
            };
            let values = match group {
                Some(group) => numbers(group).map_err(|error| format!("`{raw}`: {error}"))?,
                None => vec![String::new()],
            };
            if expanded.len().saturating_mul(values.len()) + names.len() > limit {
                return Err(format!("`{raw}` names more than {limit} nodes"));
            }
            expanded = expanded
                .iter()
                .flat_map(|head| {
                    values
                        .iter()
                        .map(move |value| format!("{head}{prefix}{value}"))
                })
                .collect();
            rest = after;
        }
        names.extend(expanded.into_iter().filter(|name| !name.is_empty()));
    }
    Ok(names)
}

/// The comma-separated items of a host list, commas inside brackets kept.
fn split_top(raw: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (index, c) in raw.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("`{raw}`: brackets inside brackets")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("`{raw}`: a `]` without its `[`")),
            ',' if depth == 0 => {
                items.push(raw[start..index].trim());
                start = index + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("`{raw}`: a `[` is not closed"));
    }
    items.push(raw[start..].trim());
    Ok(items.into_iter().filter(|item| !item.is_empty()).collect())
}

/// The numbers a bracket group names, each as written (`08-10` → 08, 09, 10).
fn numbers(group: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in group.split(',') {
        let part = part.trim();
        let (low, high) = part.split_once('-').unwrap_or((part, part));
        let digits = |text: &str| !text.is_empty() && text.chars().all(|c| c.is_ascii_digit());
        if !digits(low) || !digits(high) {
            return Err(format!("`[{group}]` holds `{part}`, not a number or range"));
        }
        let (from, to): (u64, u64) = (
            low.parse().map_err(|_| format!("`{low}` is too large"))?,
            high.parse().map_err(|_| format!("`{high}` is too large"))?,
        );
        if from > to {
            return Err(format!("`{part}` runs backwards"));
        }
        if to - from > 1_000_000 {
            return Err(format!("`{part}` is too long a range"));
        }
        let width = low.len();
        out.extend((from..=to).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_expand_as_slurm_lists_them() {
        assert_eq!(
            expand("gpu[01-04,07],login1", 100).unwrap(),
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"]
        );
        assert_eq!(expand("cn[08-10]", 100).unwrap(), ["cn08", "cn09", "cn10"]);
        assert_eq!(
            expand("rack[1-2]-n[1-2]", 100).unwrap(),
            ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
        );
        assert_eq!(
            expand("cs2.example.company.com", 100).unwrap(),
            ["cs2.example.company.com"]
        );
        assert!(expand("None assigned", 100).unwrap().is_empty());
        assert!(expand("", 100).unwrap().is_empty());
        assert!(expand("n[0-99999999]", 256).is_err());
        assert!(expand("n[3-1]", 256).is_err());
        assert!(expand("n[1-2", 256).is_err());
        assert!(expand("n[a-b]", 256).is_err());
    }
}
