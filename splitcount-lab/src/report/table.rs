//! A table of the report: rows of cells under named columns, printed
//! aligned in the terminal and written as HTML, from the same data.

use super::html::escape;

/// How a column's cells are aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// One column: its header and alignment.
#[derive(Debug, Clone)]
pub struct Column {
    /// The header.
    pub name: String,
    /// Alignment of its cells.
    pub align: Align,
    /// Whether it holds figures measured elsewhere (shown set apart).
    pub published: bool,
}

/// The header of the column of published figures.
pub const PUBLISHED: &str = "published (measured elsewhere)";

/// A table with a caption and notes below it.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// What the table shows.
    pub caption: String,
    /// The columns, left to right.
    pub columns: Vec<Column>,
    /// Rows of cells, one per column.
    pub rows: Vec<Vec<String>>,
    /// An HTML class per row (empty: none), e.g. a verdict's status.
    pub row_classes: Vec<String>,
    /// Lines printed under the table (sources, caveats).
    pub notes: Vec<String>,
}

impl Table {
    /// An empty table with `caption`.
    pub fn new(caption: impl Into<String>) -> Table {
        Table {
            caption: caption.into(),
            ..Table::default()
        }
    }

    /// Add a left-aligned column.
    pub fn text(mut self, name: &str) -> Table {
        self.columns.push(Column {
            name: name.to_owned(),
            align: Align::Left,
            published: false,
        });
        self
    }

    /// Add a right-aligned column.
    pub fn number(mut self, name: &str) -> Table {
        self.columns.push(Column {
            name: name.to_owned(),
            align: Align::Right,
            published: false,
        });
        self
    }

    /// Add the column of published figures ([`PUBLISHED`]).
    pub fn published(mut self) -> Table {
        self.columns.push(Column {
            name: PUBLISHED.to_owned(),
            align: Align::Left,
            published: true,
        });
        self
    }

    /// Append a row; missing cells are left empty, extra ones dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        self.row_with_class(cells, String::new());
    }

    /// Append a row whose HTML `<tr>` has `class` (for styling).
    pub fn row_with_class(&mut self, mut cells: Vec<String>, class: String) {
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
        self.row_classes.push(class);
    }

    /// Append a note.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// The table as aligned text, indented by two spaces.
    pub fn to_text(&self) -> String {
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                self.rows
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([c.name.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<&str>| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&self.columns)
                .zip(&widths)
                .map(|((cell, col), &w)| match col.align {
                    Align::Left => format!("{cell:<w$}"),
                    Align::Right => format!("{cell:>w$}"),
                })
                .collect();
            format!("  {}", parts.join("  ").trim_end())
        };
        let mut out = Vec::new();
        out.push(self.caption.clone());
        out.push(line(self.columns.iter().map(|c| c.name.as_str()).collect()));
        out.push(format!(
            "  {}",
            widths
                .iter()
                .map(|&w| "-".repeat(w))
                .collect::<Vec<_>>()
                .join("  ")
        ));
        for r in &self.rows {
            out.push(line(r.iter().map(String::as_str).collect()));
        }
        for n in &self.notes {
            out.push(format!("  {n}"));
        }
        out.join("\n")
    }

    /// The table as an HTML `<table>` with its caption, and its notes below.
    pub fn to_html(&self) -> String {
        let mut h = String::from("<table>\n");
        h += &format!("<caption>{}</caption>\n<thead><tr>", escape(&self.caption));
        for c in &self.columns {
            h += &format!("<th{}>{}</th>", class(c), escape(&c.name));
        }
        h += "</tr></thead>\n<tbody>\n";
        for (i, r) in self.rows.iter().enumerate() {
            match self.row_classes.get(i).filter(|c| !c.is_empty()) {
                Some(row_class) => h += &format!("<tr class=\"{}\">", escape(row_class)),
                None => h += "<tr>",
            }
            for (cell, c) in r.iter().zip(&self.columns) {
                h += &format!("<td{}>{}</td>", class(c), escape(cell));
            }
            h += "</tr>\n";
        }
        h += "</tbody>\n</table>\n";
        for n in &self.notes {
            h += &format!("<p class=\"note\">{}</p>\n", escape(n));
        }
        h
    }
}

fn class(c: &Column) -> &'static str {
    match (c.published, c.align) {
        (true, _) => " class=\"published\"",
        (false, Align::Right) => " class=\"num\"",
        (false, Align::Left) => "",
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A byte count in binary units (`1.12 GiB`).
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_in_the_terminal() {
        let mut t = Table::new("demo").text("case").number("ns/op");
        t.row(vec!["tree".into(), "1.50".into()]);
        t.row(vec!["shared-atomic".into(), "120.25".into()]);
        let text = t.to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "  case            ns/op");
        assert_eq!(lines[3], "  tree             1.50");
        assert_eq!(lines[4], "  shared-atomic  120.25");
    }

    #[test]
    fn html_cells_are_escaped() {
        let mut t = Table::new("a < b").text("x");
        t.row(vec!["<script>".into()]);
        let h = t.to_html();
        assert!(h.contains("&lt;script&gt;"));
        assert!(!h.contains("<script>"));
    }

    #[test]
    fn numbers_are_grouped_and_bytes_scaled() {
        assert_eq!(thousands(294_528), "294,528");
        assert_eq!(thousands(33_550_336), "33,550,336");
        assert_eq!(thousands(7), "7");
        assert_eq!(bytes(294_528.0 * 4096.0), "1.12 GiB");
        assert_eq!(bytes(512.0), "512 B");
    }
}
