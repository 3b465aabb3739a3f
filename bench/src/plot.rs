//! skew.png: the skew distributions (empirical CDF, log-scaled milliseconds), one panel per
//! workload, both controllers in each (SingletonJob with and without preparation). Text needs a
//! TrueType font, loaded at run time (BENCH_FONT, else DejaVu Sans where Debian puts it); without
//! one the plot has no labels.
use std::path::Path;

use plotters::prelude::*;

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn load_font() -> bool {
    let path = std::env::var("BENCH_FONT")
        .ok()
        .into_iter()
        .chain(FONTS.iter().map(|s| s.to_string()))
        .find(|p| Path::new(p).exists());
    let Some(bytes) = path.and_then(|p| std::fs::read(p).ok()) else {
        return false;
    };
    // register_font wants 'static bytes: one font, leaked once for the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
}

/// SingletonJob blue (without preparation green), CronJob red.
fn color(kind: &str) -> RGBColor {
    match kind {
        "SingletonJob" => BLUE,
        "SingletonJob lead 0" => GREEN,
        _ => RED,
    }
}

pub fn skew(path: &Path, series: &[(String, &'static str, Vec<f64>)]) -> anyhow::Result<()> {
    let text = load_font();
    if !text {
        eprintln!("bench: no TrueType font found (set BENCH_FONT): the plot has no labels");
    }
    let mut workloads: Vec<&str> = Vec::new();
    for (w, _, _) in series {
        if !workloads.contains(&w.as_str()) {
            workloads.push(w);
        }
    }
    let root =
        BitMapBackend::new(path, (1000, 330 * workloads.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((workloads.len().max(1), 1));
    for (panel, w) in panels.iter().zip(&workloads) {
        let mine: Vec<_> = series.iter().filter(|s| s.0 == *w).collect();
        let max = mine
            .iter()
            .flat_map(|s| s.2.iter().copied())
            .fold(1.0_f64, f64::max)
            * 1.5;
        let min = mine
            .iter()
            .flat_map(|s| s.2.iter().copied())
            .filter(|x| *x > 0.0)
            .fold(max, f64::min)
            .max(0.1)
            / 1.5;
        let mut b = ChartBuilder::on(panel);
        b.margin(12);
        if text {
            b.caption(format!("{w}: schedule skew, CDF"), ("sans-serif", 20))
                .x_label_area_size(36)
                .y_label_area_size(48);
        }
        let mut chart = b.build_cartesian_2d((min..max).log_scale(), 0.0..1.0)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("skew (ms, log scale)").y_desc("fraction");
        } else {
            mesh.disable_x_mesh().disable_y_mesh();
        }
        mesh.draw()?;
        for (_, kind, v) in &mine {
            let color = color(kind);
            let mut s = v.clone();
            s.sort_by(f64::total_cmp);
            let n = s.len() as f64;
            let pts: Vec<(f64, f64)> = s
                .iter()
                .enumerate()
                .flat_map(|(i, x)| {
                    let x = x.max(min);
                    [(x, i as f64 / n), (x, (i + 1) as f64 / n)]
                })
                .collect();
            let line = chart.draw_series(LineSeries::new(pts, color.stroke_width(2)))?;
            if text {
                line.label(format!("{kind} (n = {})", s.len()))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
        }
        if text {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}
