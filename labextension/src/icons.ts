/** The extension's icons, LabIcons from style/icons/ (they follow the theme via jp-icon3). */
import { LabIcon } from '@jupyterlab/ui-components';
import chartSvgStr from '../style/icons/chart.svg';
import gpuSvgStr from '../style/icons/gpu.svg';

export const gpuIcon = new LabIcon({ name: 'jupyter-gpujobs:gpu', svgstr: gpuSvgStr });

/** The dashboard's icon. */
export const chartIcon = new LabIcon({ name: 'jupyter-gpujobs:chart', svgstr: chartSvgStr });
