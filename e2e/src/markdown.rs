//! The shell blocks of the project's markdown (README.md, docs/operations.md), which tests run as
//! written.

/// A ```sh block of a markdown text and the line it starts on.
pub struct ShBlock {
    pub line: usize,
    pub script: String,
}

/// The runnable ```sh blocks of a markdown text: all but those right after a
/// `<!-- runbook: not run here; ... -->` comment (which names the test that runs them instead).
pub fn sh_blocks(text: &str) -> Vec<ShBlock> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    let mut previous = "";
    while let Some((i, line)) = lines.next() {
        if line.trim() == "```sh" {
            let body: Vec<&str> = lines
                .by_ref()
                .map(|(_, l)| l)
                .take_while(|l| l.trim() != "```")
                .collect();
            if !previous
                .trim_start()
                .starts_with("<!-- runbook: not run here")
            {
                blocks.push(ShBlock {
                    line: i + 1,
                    script: body.join("\n"),
                });
            }
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    blocks
}
