//! Admin command output: an aligned table for people, JSON lines for scripts.

use std::io::{self, Write};

use serde::Serialize;

pub(crate) use crate::domain::parse_duration;

/// A record an admin command prints. `cells` follow `COLUMNS`; JSON uses the serde fields.
pub(crate) trait Row: Serialize {
    const COLUMNS: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

pub(crate) fn print_rows<R: Row>(out: &mut impl Write, rows: &[R], json: bool) -> io::Result<()> {
    if json {
        for row in rows {
            serde_json::to_writer(&mut *out, row)?;
            out.write_all(b"\n")?;
        }
        return Ok(());
    }
    let cells: Vec<Vec<String>> = rows.iter().map(|r| r.cells()).collect();
    let mut widths: Vec<usize> = R::COLUMNS.iter().map(|c| c.chars().count()).collect();
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |values: Vec<&str>| {
        let padded: Vec<String> = values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    writeln!(out, "{}", line(R::COLUMNS.to_vec()))?;
    for row in &cells {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    if rows.is_empty() {
        writeln!(out, "(none)")?;
    }
    Ok(())
}

/// Keep table cells on one line and reasonably short; JSON output carries the full text.
pub(crate) fn one_line(text: &str, max_chars: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max_chars {
        return flat;
    }
    let mut cut: String = flat.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct R {
        id: i64,
        name: String,
    }

    impl Row for R {
        const COLUMNS: &'static [&'static str] = &["id", "name"];
        fn cells(&self) -> Vec<String> {
            vec![self.id.to_string(), self.name.clone()]
        }
    }

    #[test]
    fn table_aligns_and_json_is_one_object_per_line() {
        let rows = vec![
            R {
                id: 1,
                name: "a".into(),
            },
            R {
                id: 100,
                name: "bb".into(),
            },
        ];
        let mut table = Vec::new();
        print_rows(&mut table, &rows, false).unwrap();
        assert_eq!(
            String::from_utf8(table).unwrap(),
            "id   name\n1    a\n100  bb\n"
        );
        let mut json = Vec::new();
        print_rows(&mut json, &rows, true).unwrap();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            "{\"id\":1,\"name\":\"a\"}\n{\"id\":100,\"name\":\"bb\"}\n"
        );
    }

    #[test]
    fn one_line_flattens_and_truncates_on_char_boundaries() {
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("ééééé", 3), "éé…");
    }
}
