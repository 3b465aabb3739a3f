//! Cron syntax as Kubernetes CronJob reads it (robfig/cron v3's `ParseStandard`), rewritten into
//! the form croner parses with the same meaning.
//!
//! Written by hand because no crate parses CronJob's dialect: croner reads `SUN` as 7, so
//! `0-SUN` would be every day instead of Sundays; it refuses `5/15` (CronJob: `5-59/15`) and lists
//! containing `*`; and its errors for a reversed range or an empty list mislead. Each item of
//! a field is checked here against the field's bounds and rewritten into plain numbers; Quartz's
//! day extensions (`L`, `W`, `#`) are passed to croner unchanged.

/// One field of a cron expression: its name in messages and its bounds. `max` is the largest
/// value an `N/step` item runs up to, as in CronJob (day-of-week: Saturday; 7 is also Sunday).
#[derive(Clone, Copy)]
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

const FIELDS: [Field; 6] = [
    Field {
        name: "second",
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    Field {
        name: "day-of-month",
        min: 1,
        max: 31,
        names: &[],
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &MONTH_NAMES,
    },
    Field {
        name: "day-of-week",
        min: 0,
        max: 6,
        names: &DAY_NAMES,
    },
];

const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// Checks field count, macros, names and ranges, and rewrites the expression into the form
/// croner parses with the semantics documented on [`super::Schedule::parse`].
pub(super) fn normalize(expr: &str) -> Result<String, String> {
    let trimmed = expr.trim();
    if trimmed.starts_with('@') {
        return expand_macro(trimmed);
    }
    let fields: Vec<&str> = trimmed.split_whitespace().collect();
    let specs = match fields.len() {
        5 => &FIELDS[1..],
        6 => &FIELDS[..],
        7 => return Err("a 7th (year) field is not supported".to_string()),
        n => {
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week) \
                 or 6 with leading seconds, found {n}"
            ));
        }
    };
    let normalized = fields
        .iter()
        .zip(specs)
        .map(|(&text, &field)| normalize_field(text, field))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(normalized.join(" "))
}

fn expand_macro(name: &str) -> Result<String, String> {
    MACROS
        .iter()
        .find(|(known, _)| known.eq_ignore_ascii_case(name))
        .map(|(_, expansion)| (*expansion).to_string())
        .ok_or_else(|| {
            "unknown macro (supported: @yearly @annually @monthly @weekly @daily \
             @midnight @hourly)"
                .to_string()
        })
}

fn normalize_field(text: &str, field: Field) -> Result<String, String> {
    check_words(text, field)?;
    if field.name == "day-of-week" && text.starts_with('+') {
        // croner's prefix would silently switch the day fields to AND.
        return Err("the `+` day-of-week prefix is not supported".to_string());
    }
    // Empty list items are skipped, as CronJob does (`1,,2` is `1,2`); a list of nothing would
    // never fire.
    let items: Vec<&str> = text.split(',').filter(|item| !item.is_empty()).collect();
    if items.is_empty() {
        return Err(format!("the {} field {text:?} lists no value", field.name));
    }
    // As in CronJob, `*`, `?` and `*/1` anywhere in a list make the whole field unrestricted,
    // which matters for the day fields: an unrestricted one leaves the other in charge.
    if items
        .iter()
        .any(|item| matches!(*item, "*" | "?" | "*/1" | "?/1"))
    {
        return Ok("*".to_string());
    }
    let items = items
        .iter()
        .map(|item| normalize_item(item, field))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(items.join(","))
}

/// croner replaces names anywhere in the expression before splitting it, so `JAN` in the minute
/// field would silently mean minute 1: names are allowed only in their own field.
fn check_words(text: &str, field: Field) -> Result<(), String> {
    for word in text
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|word| !word.is_empty())
    {
        let upper = word.to_ascii_uppercase();
        let allowed = field.names.contains(&upper.as_str())
            || match field.name {
                "day-of-week" => upper == "L",
                "day-of-month" => matches!(upper.as_str(), "L" | "W" | "LW"),
                _ => false,
            };
        if !allowed {
            return Err(format!(
                "{word:?} is not allowed in the {} field",
                field.name
            ));
        }
    }
    Ok(())
}

/// One list item: `*[/step]`, `a[-b][/step]` with numbers or names, or a Quartz day extension.
fn normalize_item(item: &str, field: Field) -> Result<String, String> {
    let name = field.name;
    let is_extension = item.contains('#')
        || item.split(|c: char| !c.is_ascii_alphabetic()).any(|word| {
            !word.is_empty() && !field.names.contains(&word.to_ascii_uppercase().as_str())
        });
    if is_extension {
        if name == "day-of-week" && item.eq_ignore_ascii_case("L") {
            return Err("`L` in the day-of-week field needs a weekday before it, \
                 such as 5L for the last Friday of the month"
                .to_string());
        }
        return Ok(item.to_string());
    }
    let (range, step) = match item.split_once('/') {
        None => (item, None),
        Some((range, step)) => (range, Some(parse_step(step, item, name)?)),
    };
    let step_suffix = step.map(|s| format!("/{s}")).unwrap_or_default();
    if range == "*" || range == "?" {
        return Ok(format!("*{step_suffix}"));
    }
    let (start, end) = match range.split_once('-') {
        None => {
            let value = parse_value(range, field, false)?;
            // `N/step` runs from N to the field's maximum, as in CronJob.
            let end = if step.is_some() {
                field.max.max(value)
            } else {
                value
            };
            (value, end)
        }
        Some((start, end)) => {
            let start = parse_value(start, field, false)?;
            (start, parse_value(end, field, start > 0)?)
        }
    };
    if start > end {
        return Err(format!(
            "the range {range:?} in the {name} field is reversed: it starts after it ends"
        ));
    }
    Ok(if start == end && step.is_none() {
        start.to_string()
    } else {
        format!("{start}-{end}{step_suffix}")
    })
}

fn parse_step(step: &str, item: &str, name: &str) -> Result<u32, String> {
    match step.parse::<u32>() {
        Ok(s) if s > 0 => Ok(s),
        _ => Err(format!(
            "the step in {item:?} in the {name} field must be a positive whole number"
        )),
    }
}

/// A number or a name within the field's bounds. Sunday is 0, and 7 where it ends a range that
/// starts on a later day (`FRI-SUN`); 7 is accepted as Sunday everywhere.
fn parse_value(text: &str, field: Field, ends_range: bool) -> Result<u32, String> {
    let upper = text.to_ascii_uppercase();
    let named = field.names.iter().position(|n| *n == upper);
    let value = match named {
        Some(i) if field.name == "month" => i as u32 + 1,
        Some(0) if ends_range => 7,
        Some(i) => i as u32,
        None => text
            .parse::<u32>()
            .map_err(|_| format!("{text:?} in the {} field is not a number", field.name))?,
    };
    let max = if field.name == "day-of-week" {
        7
    } else {
        field.max
    };
    if value < field.min || value > max {
        return Err(format!(
            "{text} is out of range for the {} field ({}-{max})",
            field.name, field.min
        ));
    }
    Ok(value)
}
