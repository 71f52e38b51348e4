//! `index.html`: one self-contained page (inline CSS, inline SVG plots, no
//! scripts, nothing fetched), so it opens from a CI artifact or a laptop
//! with no network.

use super::table::Table;

/// One suite's part of the page.
#[derive(Debug)]
pub struct Section<'a> {
    /// The anchor id (the suite's name).
    pub id: &'a str,
    /// The heading.
    pub title: &'a str,
    /// What the suite measures and how to read it.
    pub about: &'a str,
    /// Wall time the suite took.
    pub seconds: f64,
    /// Its tables.
    pub tables: &'a [Table],
    /// Its plots, as SVG documents.
    pub plots: &'a [String],
}

/// Escape text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto;
       max-width: 1280px; padding: 0 1.5em; color: #1b1b1b; line-height: 1.45; }
h1 { margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 2em; }
.lead { color: #555; margin-top: 0; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 1em 0 0.4em; font-size: 0.9em; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.4em; }
th, td { padding: 0.25em 0.8em; border-bottom: 1px solid #e4e4e4; text-align: left; }
th { background: #f4f4f4; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr[class] td:last-child { white-space: nowrap; }
td.published, th.published { color: #6b4e16; background: #fbf6ea; font-style: italic; }
p.note { color: #666; font-size: 0.85em; margin: 0.15em 0; }
.about { max-width: 60em; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; margin-top: 1em; }
.plots svg { max-width: 100%; height: auto; border: 1px solid #eee; }
.time { color: #888; font-size: 0.8em; font-weight: normal; }
tr.met td:last-child { color: #1a7f37; font-weight: 600; }
tr.not-met td:last-child { color: #c62828; font-weight: 600; }
tr.unstable td:last-child { color: #9a6700; font-weight: 600; }
tr.not-measured td:last-child { color: #777; }
footer { margin-top: 3em; color: #777; font-size: 0.85em; border-top: 1px solid #ddd; }
";

/// The whole page: a heading with `lead` lines, the verdicts against the
/// targets, the machine's shape, then one section per suite.
pub fn page(lead: &[String], verdicts: &Table, machine: &Table, sections: &[Section]) -> String {
    let mut h = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>splitcount lab report</title>\n<style>",
    );
    h += STYLE;
    h += "</style>\n</head>\n<body>\n<h1>splitcount lab report</h1>\n";
    for line in lead {
        h += &format!("<p class=\"lead\">{}</p>\n", escape(line));
    }
    h += "<nav><a href=\"#summary\">summary</a><a href=\"#machine\">machine</a>";
    for s in sections {
        h += &format!("<a href=\"#{}\">{}</a>", escape(s.id), escape(s.id));
    }
    h += "</nav>\n";
    if !verdicts.rows.is_empty() {
        h += "<h2 id=\"summary\">Summary: the targets, measured here</h2>\n";
        h += &verdicts.to_html();
    }
    h += "<h2 id=\"machine\">Machine</h2>\n";
    h += &machine.to_html();
    for s in sections {
        h += &format!(
            "<section id=\"{}\">\n<h2>{} <span class=\"time\">({:.1} s)</span></h2>\n\
             <p class=\"about\">{}</p>\n",
            escape(s.id),
            escape(s.title),
            s.seconds,
            escape(s.about)
        );
        for t in s.tables {
            h += &t.to_html();
        }
        if !s.plots.is_empty() {
            h += "<div class=\"plots\">\n";
            for svg in s.plots {
                h += svg;
                h += "\n";
            }
            h += "</div>\n";
        }
        h += "</section>\n";
    }
    h += "<footer><p>Figures in the published column were measured elsewhere; their \
          sources are collected in the repository's IMPLEMENTATION.md, §9 (\"Published \
          figures and their sources\"). The targets and how a verdict is reached: README.md, \
          \"Targets\".</p></footer>\n";
    h += "</body>\n</html>\n";
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
    }

    #[test]
    fn the_page_inlines_plots_and_links_sections() {
        let tables = [Table::new("t").text("x")];
        let plots = ["<svg width=\"1\"></svg>".to_owned()];
        let s = Section {
            id: "counters",
            title: "Counters",
            about: "adds",
            seconds: 1.0,
            tables: &tables,
            plots: &plots,
        };
        let mut verdicts = Table::new("v").text("target").text("verdict");
        verdicts.row_with_class(vec!["stock".into(), "✗ not met".into()], "not-met".into());
        let page = page(&["lead".into()], &verdicts, &Table::new("m"), &[s]);
        assert!(page.find("id=\"summary\"").unwrap() < page.find("id=\"machine\"").unwrap());
        assert!(page.contains("<tr class=\"not-met\">"));
        assert!(page.contains("<a href=\"#counters\">counters</a>"));
        assert!(page.contains("<section id=\"counters\">"));
        assert!(page.contains("<svg width=\"1\"></svg>"));
    }
}
