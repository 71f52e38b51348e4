//! `replay`: feed `{"cpu":c,"delta":d}` lines to a counter on a simulated
//! machine and print its state after each one.

use crate::accuracy::Spec;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    cpu: usize,
    /// A JSON number with an integer value: `-0` and `1e3` too (serde
    /// reads those as floats), exactly below 2⁵³ in magnitude.
    delta: serde_json::Number,
}

/// `n` as an `i64` if its value is an integer that a float written in
/// JSON holds exactly.
fn integer(n: &serde_json::Number) -> Option<i64> {
    n.as_i64().or_else(|| {
        let f = n.as_f64()?;
        (f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0).then_some(f as i64)
    })
}

#[derive(Serialize)]
struct Output {
    step: usize,
    approximate: i64,
    precise: i64,
}

/// Replay `input` into the counter of `spec`, writing one line per step to
/// `out`. Blank lines are skipped. The first bad line stops the replay with
/// an error naming it (1-based), after the lines before it were written.
pub fn run(spec: &Spec, input: impl BufRead, mut out: impl Write) -> Result<(), String> {
    let c = spec.build()?;
    let mut step = 0;
    for (n, line) in input.lines().enumerate() {
        let line_no = n + 1;
        let line = line.map_err(|e| format!("line {line_no}: cannot read input: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        // Only the documented object form: serde would also take `[cpu, delta]`.
        let expected =
            |why: String| format!("line {line_no}: expected {{\"cpu\":N,\"delta\":N}}: {why}");
        // Parsed straight into `Input` (not through a `Value`, whose map
        // keeps the last of two equal keys): a field given twice is an error.
        if !line.trim_start().starts_with('{') {
            return Err(expected(format!("got {}", line.trim())));
        }
        let Input { cpu, delta } =
            serde_json::from_str(&line).map_err(|e| expected(e.to_string()))?;
        let delta = integer(&delta).ok_or_else(|| {
            expected(format!(
                "delta {delta} is not an integer within the i64 range"
            ))
        })?;
        c.add_on(cpu, delta)
            .map_err(|e| format!("line {line_no}: {e}"))?;
        let o = Output {
            step,
            approximate: c.approximate(),
            precise: c.precise(),
        };
        writeln!(
            out,
            "{}",
            serde_json::to_string(&o).expect("outputs serialize")
        )
        .map_err(|e| format!("cannot write output: {e}"))?;
        step += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitcount::counter::Design;

    fn replay(design: Design, cpus: usize, input: &str) -> (Result<(), String>, String) {
        let mut spec = Spec::new(design, cpus);
        spec.batch = Some(4);
        let mut out = Vec::new();
        let r = run(&spec, input.as_bytes(), &mut out);
        (r, String::from_utf8(out).unwrap())
    }

    #[test]
    fn each_input_line_gives_the_state_after_it() {
        let (r, out) = replay(
            Design::Batched,
            2,
            "{\"cpu\":0,\"delta\":3}\n\n{\"cpu\":0,\"delta\":1}\n",
        );
        r.unwrap();
        assert_eq!(
            out,
            "{\"step\":0,\"approximate\":0,\"precise\":3}\n{\"step\":1,\"approximate\":4,\"precise\":4}\n"
        );
    }

    #[test]
    fn bad_lines_are_named_and_stop_the_replay() {
        let (r, out) = replay(Design::Tree, 2, "{\"cpu\":0,\"delta\":1}\n{\"cpu\":0}\n");
        assert!(r.unwrap_err().starts_with("line 2: expected"));
        assert_eq!(
            out.lines().count(),
            1,
            "the good line before it was replayed"
        );
        let (r, _) = replay(Design::Tree, 2, "{\"cpu\":2,\"delta\":1}\n");
        assert_eq!(
            r.unwrap_err(),
            "line 1: CPU 2 does not exist on a machine of 2 CPUs"
        );
        let (r, _) = replay(Design::Tree, 2, "not json\n");
        assert!(r.unwrap_err().starts_with("line 1:"));
        let (r, _) = replay(Design::Tree, 2, "{\"cpu\":0,\"delta\":1,\"x\":2}\n");
        assert!(
            r.unwrap_err().starts_with("line 1:"),
            "unknown fields are refused"
        );
        for not_an_integer in ["1.5", "1e300", "9007199254740993.0"] {
            let (r, _) = replay(
                Design::Tree,
                2,
                &format!("{{\"cpu\":0,\"delta\":{not_an_integer}}}\n"),
            );
            assert!(
                r.unwrap_err().contains("not an integer"),
                "{not_an_integer}"
            );
        }
    }

    #[test]
    fn integers_written_as_floats_are_taken() {
        let (r, out) = replay(
            Design::Tree,
            2,
            "{\"cpu\":0,\"delta\":-0}\n{\"cpu\":1,\"delta\":1e3}\n{\"cpu\":1,\"delta\":-2.0}\n",
        );
        r.unwrap();
        assert!(
            out.lines().last().unwrap().contains("\"precise\":998"),
            "{out}"
        );
    }
}
